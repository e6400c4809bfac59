"""The Prefect layer's blocks: credentials by variable name, compute targets, job records.

Every block class is an attribute of this package so that one command registers them all from
the project directory: ``prefect block register --file blocks/__init__.py``.
"""

from blocks.bucket import TaoS3Bucket
from blocks.credentials import CredentialSet, HuggingFaceEnvCredentials, NGCEnvCredentials, S3EnvCredentials
from blocks.records import JobRecords
from blocks.targets import ComputeTarget, KubernetesTarget, LocalTarget

__all__ = ["ComputeTarget", "CredentialSet", "HuggingFaceEnvCredentials", "JobRecords", "KubernetesTarget",
           "LocalTarget", "NGCEnvCredentials", "S3EnvCredentials", "TaoS3Bucket"]
