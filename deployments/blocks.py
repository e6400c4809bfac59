"""Register the block types and save the blocks prefect.yaml's (and deployments/docker.yaml's and
deployments/slurm.yaml's) deployments name.

    .venv/bin/python -m deployments.blocks [--records LOCATION] [--run-root DIR] [--staging-root DIR]
                                            [--allow-network] [--results S3_PREFIX] [--overwrite]

Saves ``tao-local-target/local``, ``tao-docker-target/docker`` (the daemon of ``$DOCKER_HOST`` on the
worker, no GPU until edited), ``tao-slurm-target/slurm`` (the cluster of ``$SLURM_CONF``, pyxis,
its run root to be set on the shared filesystem), ``tao-job-records/local`` and the ``default`` credential blocks
(the standard variable names: AWS_* with the legacy TAO names behind them, HF_TOKEN, NGC_KEY),
and with ``--results`` the ``tao-s3-bucket/results`` a Kubernetes pool keeps flow results in.
Blocks that already exist are kept unless ``--overwrite``, so a rerun never undoes an edit made
in the UI. Registration alone is ``prefect block register --file blocks/__init__.py`` (see
docs/prefect.md).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from prefect.blocks.core import Block

from blocks import TARGETS, HuggingFaceEnvCredentials, JobRecords, NGCEnvCredentials, S3EnvCredentials, TaoS3Bucket
from tao_data_io.backends import settings_from
from tao_data_io.backends.local.settings import DEFAULT_ROOT, ROOT_VARIABLE
from tao_data_io.uris import parse_s3_url


@dataclass(frozen=True)
class Defaults:
    records: str | None = None
    run_root: str | None = None
    staging_root: str | None = None
    allow_network: bool = False
    #: ``s3://BUCKET/PREFIX/`` for flow results (a Kubernetes pool's: each flow run is a fresh pod).
    results: str | None = None

    def blocks(self) -> dict[str, Block]:
        """``BLOCK-TYPE/NAME`` → the block to save there."""
        results = {}
        if self.results:
            url = parse_s3_url(self.results, field="--results")
            results["tao-s3-bucket/results"] = TaoS3Bucket(bucket_name=url.bucket, bucket_folder=url.key)
        return {**results,
            "tao-local-target/local": TARGETS["local"](
                staging_root=self.staging_root,
                settings=settings_from("local", {"run_root": self.run_root, "allow_network": self.allow_network})),
            "tao-docker-target/docker": TARGETS["docker"](staging_root=self.staging_root,
                                                          settings=settings_from("docker", {})),
            "tao-slurm-target/slurm": TARGETS["slurm"](staging_root=self.staging_root,
                                                       settings=settings_from("slurm", {})),
            "tao-job-records/local": JobRecords(location=self.records),
            "tao-s3-credentials/default": S3EnvCredentials(),
            "tao-hugging-face-credentials/default": HuggingFaceEnvCredentials(),
            "tao-ngc-credentials/default": NGCEnvCredentials(),
        }


def save_defaults(defaults: Defaults, *, overwrite: bool = False) -> list[str]:
    """Register every block type and save the defaults; returns one line per block."""
    for target in TARGETS.values():  # every backend's, the embedded default's saved below (a cluster needs its own)
        target.register_type_and_schema()
    TaoS3Bucket.register_type_and_schema()
    said = []
    for slug_name, block in defaults.blocks().items():
        name = slug_name.split("/", 1)[1]
        try:
            block.save(name, overwrite=overwrite)
            said.append(f"saved {slug_name}")
        except ValueError as exc:
            if "already in use" not in str(exc):
                raise
            said.append(f"kept {slug_name} (exists; --overwrite replaces it)")
    return said


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.blocks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", help="job records: an absolute directory or s3://BUCKET/PREFIX/ "
                                          "(default: $TAO_DATA_IO_RECORDS, else ~/.tao-data-io/jobs on the worker)")
    parser.add_argument("--run-root", help=f"the local target's run root (default: ${ROOT_VARIABLE}, else "
                                           f"{DEFAULT_ROOT} on the worker)")
    parser.add_argument("--staging-root", help="where the worker stages inputs (default ~/.tao-data-io/work)")
    parser.add_argument("--allow-network", action="store_true",
                        help="let local jobs that ask for it (network: true) use the worker's network")
    parser.add_argument("--results", help="save tao-s3-bucket/results at s3://BUCKET/PREFIX/, the flow results' "
                                          "storage a Kubernetes pool names (deployments/kubernetes.yaml)")
    parser.add_argument("--overwrite", action="store_true", help="replace blocks that exist")
    args = parser.parse_args(argv)
    defaults = Defaults(records=args.records, run_root=args.run_root, staging_root=args.staging_root,
                        allow_network=args.allow_network, results=args.results)
    for line in save_defaults(defaults, overwrite=args.overwrite):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
