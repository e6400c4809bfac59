"""What a transfer holds in memory is bounded by the executor's budget, not by the size of what
it moves: a tree of many large files moves in the memory of a few of them, whichever path each
file takes — a multipart upload, one PUT of a file read whole, a download streamed to disk.

Measured as a user would meet it: the peak resident memory (``VmHWM``) of a process of its own
that runs the transfer against the embedded S3 server, against its resident memory before the
transfer started."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from bench.latency_proxy import LatencyProxy
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.client import make_s3_client
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.obstore_executor import MEMORY_BUDGET

MIB = 1024 * 1024
#: What the process may grow by beyond the budget: the runtime's own buffers and allocator slack.
SLACK = 64 * MIB

_SYNC = textwrap.dedent("""
    import re, sys
    from pathlib import Path
    from tao_data_io.credentials import s3_credentials_from_env
    from tao_data_io.transfer.engine import TransferEngine
    from tao_data_io.transfer.options import TransferOptions

    def status(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    with TransferEngine(s3_credentials_from_env()) as engine:
        engine.executor  # built (obstore loaded) before the baseline
        before = status("VmRSS")
        if len(sys.argv) > 3:  # named keys, as selective staging asks for them: sizes not known
            bucket, _, prefix = sys.argv[1].removeprefix("s3://").partition("/")
            keys = [(prefix + name, name) for name in sys.argv[3:]]
            summary = engine.download_keys(bucket, keys, Path(sys.argv[2]), TransferOptions())
        else:
            summary = engine.sync(sys.argv[1], sys.argv[2])
    print(summary.ok, summary.transferred_files, status("VmHWM") - before)
""")


def _tree(root: Path, files: int, size: int) -> Path:
    """``files`` sparse files of ``size`` bytes: nothing to write here, yet every byte is read and sent."""
    root.mkdir()
    for index in range(files):
        with open(root / f"shard-{index:02d}.bin", "wb") as file:
            file.truncate(size)
    return root


def _grown(server: EmbeddedS3, source: str, destination: str, files: int, *names: str, endpoint: str = "") -> int:
    env = {**os.environ, **server.env(), **({"AWS_ENDPOINT_URL": endpoint} if endpoint else {})}
    child = subprocess.run([sys.executable, "-c", _SYNC, source, destination, *names],
                           env=env, capture_output=True, text=True, check=False)
    assert child.returncode == 0, child.stderr
    ok, transferred, grown = child.stdout.split()
    assert (ok, int(transferred)) == ("True", files)
    return int(grown)


@pytest.mark.parametrize(("files", "size"), [(12, 40 * MIB), (40, 8 * MIB)], ids=["multipart", "one-put"])
def test_an_upload_of_many_large_files_holds_no_more_than_the_memory_budget(
        s3_server: EmbeddedS3, s3_prefix: str, tmp_path: Path, files: int, size: int) -> None:
    grown = _grown(s3_server, str(_tree(tmp_path / "results", files, size)), s3_prefix, files)
    assert grown <= MEMORY_BUDGET + SLACK, (
        f"the upload grew by {grown / MIB:.0f} MiB, over the budget of {MEMORY_BUDGET / MIB:.0f} MiB")


@pytest.mark.parametrize("named", [False, True], ids=["listed", "named-keys"])
def test_a_download_of_many_streamed_objects_holds_no_more_than_the_memory_budget(
        s3_server: EmbeddedS3, s3_prefix: str, tmp_path: Path, named: bool) -> None:
    files = 60  # of 6 MiB: read as a stream (objects of 8 MiB and more go to an s5cmd child)
    source = _tree(tmp_path / "source", files, 6 * MIB)
    with TransferEngine(s3_server.credentials) as engine:
        assert engine.sync(str(source), s3_prefix).ok
    names = sorted(path.name for path in source.iterdir()) if named else []
    grown = _grown(s3_server, s3_prefix, str(tmp_path / "copy"), files, *names)
    assert grown <= MEMORY_BUDGET + SLACK, (
        f"the download grew by {grown / MIB:.0f} MiB, over the budget of {MEMORY_BUDGET / MIB:.0f} MiB")


def test_an_object_grown_since_it_was_listed_is_streamed_not_read_whole(
        s3_server: EmbeddedS3, s3_prefix: str, tmp_path: Path) -> None:
    """Listed small, it would be read in one buffer; replaced by a large one before its GET, the
    read is refused (bound to the listed ETag) and done again unbound — and what decides one
    buffer or a stream is the object read, not the size listed."""
    bucket, _, prefix = s3_prefix.removeprefix("s3://").partition("/")
    client = make_s3_client(s3_server.credentials)
    client.put_object(Bucket=bucket, Key=prefix + "weights.bin", Body=b"w" * MIB)
    replaced: list[bool] = []

    def replace_before_the_read(head: bytes) -> None:
        if head.startswith(b"GET") and f"/{bucket}/{prefix}weights.bin".encode() in head and not replaced:
            client.put_object(Bucket=bucket, Key=prefix + "weights.bin", Body=bytes(160 * MIB))
            replaced.append(True)

    with LatencyProxy("127.0.0.1", s3_server.port, 0, on_request=replace_before_the_read) as proxy:
        grown = _grown(s3_server, s3_prefix, str(tmp_path / "copy"), 1, endpoint=f"http://127.0.0.1:{proxy.port}")
    assert replaced and (tmp_path / "copy" / "weights.bin").stat().st_size == 160 * MIB
    assert grown <= 64 * MIB, f"the download grew by {grown / MIB:.0f} MiB for an object streamed in chunks"
