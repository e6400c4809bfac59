"""What a transfer holds in memory is bounded by the executor's budget, not by the size of what
it moves: a results tree of many large files uploads in the memory of a few of them.

Measured as a user would meet it: the peak resident memory (``VmHWM``) of a process of its own
that uploads the tree to the embedded S3 server, against its resident memory before the
transfer started."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer.obstore_executor import MEMORY_BUDGET

MIB = 1024 * 1024
#: Twelve files of 40 MiB (five parts each): 480 MiB, several times the budget.
FILES, FILE_MIB = 12, 40
#: What the process may grow by beyond the budget: the runtime's own buffers and allocator slack.
SLACK = 96 * MIB

_UPLOAD = textwrap.dedent("""
    import re, sys
    from tao_data_io.credentials import s3_credentials_from_env
    from tao_data_io.transfer.engine import TransferEngine

    def status(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024

    with TransferEngine(s3_credentials_from_env()) as engine:
        engine.executor  # built (obstore loaded) before the baseline
        before = status("VmRSS")
        summary = engine.sync(sys.argv[1], sys.argv[2])
    print(summary.ok, summary.transferred_files, status("VmHWM") - before)
""")


def test_an_upload_of_many_large_files_holds_no_more_than_the_memory_budget(
        s3_server: EmbeddedS3, s3_prefix: str, tmp_path: Path) -> None:
    source = tmp_path / "results"
    source.mkdir()
    for index in range(FILES):  # sparse: nothing to write here, yet every byte is read and sent
        with open(source / f"shard-{index:02d}.bin", "wb") as file:
            file.truncate(FILE_MIB * MIB)
    child = subprocess.run([sys.executable, "-c", _UPLOAD, str(source), s3_prefix],
                           env={**os.environ, **s3_server.env()}, capture_output=True, text=True, check=False)
    assert child.returncode == 0, child.stderr
    ok, transferred, grown = child.stdout.split()
    assert (ok, int(transferred)) == ("True", FILES)
    assert int(grown) <= MEMORY_BUDGET + SLACK, (
        f"the upload grew by {int(grown) / MIB:.0f} MiB, over the budget of {MEMORY_BUDGET / MIB:.0f} MiB")
