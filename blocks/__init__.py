"""The Prefect layer's blocks: credentials by variable name, compute targets, job records.

Every block class is an attribute of this package so that one command registers them all from
the project directory: ``.venv/bin/python -m prefect block register -m blocks``.
"""

from blocks.credentials import CredentialSet, HuggingFaceEnvCredentials, NGCEnvCredentials, S3EnvCredentials
from blocks.records import JobRecords
from blocks.targets import ComputeTarget, KubernetesTarget, LocalTarget

__all__ = ["ComputeTarget", "CredentialSet", "HuggingFaceEnvCredentials", "JobRecords", "KubernetesTarget",
           "LocalTarget", "NGCEnvCredentials", "S3EnvCredentials"]
