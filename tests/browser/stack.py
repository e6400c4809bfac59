"""The demo's stack for the browser suite: Prefect's server (its UI on), the ``tao-local`` process
pool, the project's blocks, ``prefect deploy --all`` with the schemas closed, and a process worker
— started by :mod:`deployments.stack` and :mod:`deployments.demo`'s own pieces, in a directory of
the test session's, on the session's embedded S3 server, and stopped by the pids it recorded.

The only differences from ``make demo``: the stack's home is a temporary directory (not
``.demo/``), there is no model hub stand-in (no test request names an ``hf://`` model), and two more
blocks are saved (``tao-local-target/browser``, ``tao-job-records/browser``) for the run form's
pickers to choose over the defaults.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deployments.demo import CHECKOUT, POOL, RECORDS_PREFIX, save_blocks, without_credentials, worker_environment
from deployments.stack import Stack, free_port
from tao_data_io.embedded.s3 import EmbeddedS3

#: The blocks the form's pickers choose (saved besides the defaults the deployments name).
PICKED_TARGET = "tao-local-target/browser"
PICKED_RECORDS = "tao-job-records/browser"
PICKED_RECORDS_PREFIX = "browser-suite/jobs/"


@dataclass
class PrefectStack:
    home: Path
    api: str
    bucket: str
    env: dict[str, str]
    stack: Stack = field(repr=False)

    @property
    def server(self) -> str:
        return self.api.removesuffix("/api")

    @property
    def ui(self) -> str:
        """The UI the server's ``/`` sends a browser to (its ``default_ui``: v2 in Prefect 3.9, at
        ``/v2``), as the server's own ``/ui-settings`` says."""
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.server}/ui-settings", timeout=10) as response:
            settings = json.load(response)
        base = settings[f"{settings['default_ui']}_base_url"] or "/"
        return self.server + base.rstrip("/")

    @property
    def default_records(self) -> str:
        """Where ``tao-job-records/local`` (the deployments' default) keeps job records."""
        return f"s3://{self.bucket}/{RECORDS_PREFIX}"

    @property
    def picked_records(self) -> str:
        return f"s3://{self.bucket}/{PICKED_RECORDS_PREFIX}"

    @contextmanager
    def client(self) -> Iterator[Any]:
        """A sync Prefect client of this stack's API (the test process's own settings are left alone)."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api}):
            with get_client(sync_client=True) as client:
                yield client

    def stop(self) -> list[str]:
        return self.stack.stop()


def start_stack(home: Path, s3: EmbeddedS3, bucket: str) -> PrefectStack:
    """Start the stack under ``home`` (logs: ``home/*.log``); stop it with :meth:`PrefectStack.stop`
    even when this raises (what was started is recorded as it starts)."""
    stack = Stack(home)
    port = free_port()
    env = worker_environment(s3.credentials, bucket, "http://127.0.0.1:9", port)  # no hub: nothing asks for one
    env.update({"PREFECT_HOME": str(home / "prefect"), "HF_HOME": str(home / "hf-home")})
    # The server's log says why it answered 503 (a retryable error: SQLite's busy database).
    api = stack.start_prefect_server({**without_credentials(env), "PREFECT_SERVER_LOG_RETRYABLE_ERRORS": "true"}, port)
    started = PrefectStack(home=home, api=api, bucket=bucket, env=env, stack=stack)
    _prepare(started)
    stack.start_worker(env, POOL, CHECKOUT)
    done = subprocess.run([sys.executable, "-m", "prefect", "deploy", "--all", "--no-prompt"], env=env, cwd=CHECKOUT,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    (home / "deploy.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"prefect deploy --all failed:\n{(done.stdout + done.stderr)[-3000:]}")
    with started.client():
        from deployments.schemas import close_parameter_schemas

        close_parameter_schemas()
    return started


def _prepare(started: PrefectStack) -> None:
    """The work pool and the blocks, as the demo's ``prepare_prefect`` (whose paths are the demo's
    own ``.demo/``), plus the blocks the pickers choose — saved first, so that the demo's block
    registration, last, leaves every block type with the logo the stack's server serves."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.workers.process import ProcessWorker

    from blocks import JobRecords, LocalTarget
    from tao_data_io.backends.local.settings import LocalSettings

    home = started.home
    with started.client() as client:
        client.create_work_pool(WorkPoolCreate(name=POOL, type="process",
                                               base_job_template=ProcessWorker.get_default_base_job_template()))
        LocalTarget(settings=LocalSettings(run_root=str(home / "picked-local")),
                    staging_root=str(home / "picked-work")).save(PICKED_TARGET.split("/")[1], overwrite=True)
        JobRecords(location=started.picked_records).save(PICKED_RECORDS.split("/")[1], overwrite=True)
    save_blocks(started.env, records=started.default_records, run_root=home / "local", staging_root=home / "work")
