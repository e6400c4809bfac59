"""The Prefect layer's blocks: credentials by variable name, compute targets, job records.

Every block class is an attribute of this package so that one command registers them all from
the project directory: ``prefect block register --file blocks/__init__.py``.
"""

from blocks.bucket import TaoS3Bucket
from blocks.credentials import CredentialSet, HuggingFaceEnvCredentials, NGCEnvCredentials, S3EnvCredentials
from blocks.records import JobRecords
from blocks.targets import EXPORTED, TARGETS, ComputeTarget

# Each backend's target block, a member under its own name (``LocalTarget``, ``KubernetesTarget``, a
# plugin's), so that ``prefect block register --file blocks/__init__.py`` finds it too.
globals().update(EXPORTED)

__all__ = ["TARGETS", "ComputeTarget", "CredentialSet", "HuggingFaceEnvCredentials", "JobRecords", "NGCEnvCredentials",
           "S3EnvCredentials", "TaoS3Bucket", *EXPORTED]
