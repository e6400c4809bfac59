"""What a local frame prints, on the host: bounded by the target's ``log_limit`` (its head and its
newest output kept, a line saying how many bytes were dropped between), followed without loss or
repetition of what was kept, and read back in bounded tails however the job prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tao_data_io.redaction import Redactor
from tao_data_io.launch.backend import TAIL_BYTES
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.launch.joblog import JobLog, LogWriter, lines_since
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.quantities import quantity_bytes

from .local_frame import finished, make_plan

LINES = 'i=1; while [ $i -le {count} ]; do printf "line %06d\\n" $i; i=$((i + 1)); done'


@pytest.fixture
def small_logs(tmp_path: Path, sandbox: None) -> LocalBackend:
    return LocalBackend(LocalSettings(run_root=str(tmp_path / "local"), log_limit="64Ki"))


def _on_disk(backend: LocalBackend, job_id: str) -> int:
    return sum(path.stat().st_size for path in (backend.run_root / job_id / "run").glob("rank-0.log*"))


def test_a_job_cannot_fill_the_hosts_disk_through_what_it_prints(tmp_path: Path, local_backend: LocalBackend) -> None:
    """A frame of 64Mi once wrote 512 MiB to the host's disk through stdout: its output was a file
    nothing bounded. Now a job printing twice the default log limit leaves at most that limit on
    disk, and says what it dropped."""
    limit = quantity_bytes(LocalSettings().log_limit)
    script = f"head -c {2 * limit} /dev/zero | tr '\\0' 'x'; echo; echo the end"
    ref = local_backend.submit(make_plan(tmp_path, script=script)).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE"
    assert _on_disk(local_backend, "job-1") <= limit
    assert local_backend.logs(ref, tail=1) == "the end\n"
    shown = local_backend.logs(ref)
    assert len(shown) <= limit + 200 and shown.count("bytes of this output were dropped here") == 1


def test_a_capped_log_keeps_its_head_and_tail_and_says_what_was_dropped(tmp_path: Path,
                                                                       small_logs: LocalBackend) -> None:
    count = 20_000  # 12 bytes a line: 240,000 bytes against a limit of 64Ki
    ref = small_logs.submit(make_plan(tmp_path, script=LINES.format(count=count))).backend_ref
    assert finished(small_logs, ref).state == "COMPLETE", small_logs.logs(ref, tail=5)
    assert _on_disk(small_logs, "job-1") <= 64 * 1024
    shown = small_logs.logs(ref).splitlines()
    note = next(n for n, line in enumerate(shown) if "were dropped here" in line)
    head, tail = shown[:note], shown[note + 1:]
    # Whole lines each side (a gap drops the lines it cuts whole: no half of a line, or of a
    # secret in it, comes out), the first ones and the last ones, in order, none repeated.
    assert head == [f"line {n:06d}" for n in range(1, len(head) + 1)]
    assert tail == [f"line {n:06d}" for n in range(count - len(tail) + 1, count + 1)]
    assert int(shown[note].split()[2]) == 12 * (count - len(head) - len(tail))  # exactly what was dropped


def test_a_follower_sees_everything_kept_once_and_each_gap_once(tmp_path: Path, small_logs: LocalBackend) -> None:
    """Followed from the start after the fact (a watcher that fell behind): the pieces put
    together are the log as kept, the note of what was dropped included once."""
    ref = small_logs.submit(make_plan(tmp_path, script=LINES.format(count=20_000))).backend_ref
    assert finished(small_logs, ref).state == "COMPLETE"
    cursor, pieces = json.dumps({"0": 0}), []
    while True:
        chunk = small_logs.follow_logs(ref, cursor)
        if chunk.cursor == cursor:
            break
        pieces.append(chunk.text)
        cursor = chunk.cursor
    assert "".join(pieces) == small_logs.logs(ref)
    assert "".join(pieces).count("were dropped here") == 1


def test_a_tail_of_one_endless_line_reads_a_bounded_part_of_it(tmp_path: Path, local_backend: LocalBackend) -> None:
    """``logs --tail 5`` of a job whose log is one long line read the whole log, block by block,
    counting newlines over all it had read each time (16 MiB in 2.9 s, 64 MiB in 85 s), and
    collect's failure report read the same tail with no byte cap. A tail now reads at most
    :data:`TAIL_BYTES`, each byte once."""
    script = "head -c 8388608 /dev/zero | tr '\\0' 'x'"
    ref = local_backend.submit(make_plan(tmp_path, script=script)).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE"
    assert 0 < len(local_backend.logs(ref, tail=5)) <= TAIL_BYTES


@pytest.mark.parametrize("segment", [None, 1024])
def test_a_tail_is_the_last_lines_whatever_the_blocks(tmp_path: Path, segment: int | None) -> None:
    """Lines of every length across block and segment boundaries: the tail is exactly the
    stream's last lines (a log written before logs had segments is its one file)."""
    log = tmp_path / "rank-0.log"
    writer = LogWriter(log, segment)
    lines = [f"{n:05d} " + "y" * (n * 37 % 300) + "\n" for n in range(40)]
    writer.write("".join(lines).encode())
    writer.close()
    read = JobLog(log, segment)
    kept = read.text()
    for count in (0, 1, 2, 5):
        expected = "".join(kept.splitlines(keepends=True)[-count:]) if count else ""
        assert read.tail(count, 1 << 20) == expected
    assert read.tail(None, 1 << 20) == kept
    text, _ = lines_since(read, None, limit=1 << 16, start_bytes=2000)
    assert kept.endswith(text) and text.endswith("\n") and text.count("\n") >= 1


SECRET = "wandb-0123456789abcdef-SECRET-VALUE"


def _fragments(text: str) -> list[str]:
    """Every 8 characters of :data:`SECRET` in a row found in ``text`` outside a whole copy of it
    (which a mask knows): none may be there."""
    rest = text.replace(SECRET, "")
    return [SECRET[i:i + 8] for i in range(len(SECRET) - 7) if SECRET[i:i + 8] in rest]


#: What a watcher masks what it shows with: the job forwards SECRET as WANDB_KEY.
MASK = Redactor({"WANDB_KEY": SECRET}, secret_names=["WANDB_KEY"])


@pytest.mark.parametrize("segment", [16 * 1024, 1 << 20])
@pytest.mark.parametrize("secret_at", ["across the segment's end", "across where the gap's look for a line ends"])
def test_no_half_of_a_secret_is_shown_beside_a_gap(tmp_path: Path, segment: int, secret_at: str) -> None:
    """Segments are cut at byte counts, so a dropped segment cuts a line — and a secret in it — in
    two, and each half alone is nothing a mask of the whole value knows. The lines a gap cuts are
    dropped whole; a line longer than the look for its end is cut that far from the gap, and what
    stands beside the cut and could be half of a secret is masked."""
    for line_bytes in (200, 300_000):  # shorter and longer than the look for a line's end
        log = tmp_path / f"rank-{line_bytes}-{segment}.log"
        writer = LogWriter(log, segment)
        edge = 0 if secret_at == "across the segment's end" else 65536
        before = segment - edge - len(SECRET) // 2 - (line_bytes // 2 if line_bytes < segment and not edge else 0)
        if before < 0:
            continue
        writer.write(b"A" * before + SECRET.encode() + b"B" * line_bytes + b"\n")
        for _ in range(6):  # enough to drop segments after the head
            writer.write(b"C" * (segment - 1) + b"\n")
        writer.close()
        read = JobLog(log, segment)
        for shown in (read.text(), read.tail(5, 1 << 20), read.tail(None, 4 * segment)):
            assert _fragments(MASK(shown)) == [], (line_bytes, _fragments(MASK(shown)))
        assert "were dropped here" in read.text()


@pytest.mark.parametrize("newline_at_the_end", [True, False])
def test_a_tail_that_begins_inside_a_line_never_shows_the_end_of_a_secret(tmp_path: Path,
                                                                         newline_at_the_end: bool) -> None:
    """A tail reads the end of a log within a byte budget: the line its window begins inside could
    begin with the end of a secret (``logs --tail`` and the failure report showed one). That line
    goes, or — when it is all the window holds — the start of what is shown is a cut, beside which
    a half of a secret is masked."""
    log = tmp_path / "rank-0.log"
    writer = LogWriter(log, None)
    ending = b"\nlast line\n" if newline_at_the_end else b""
    writer.write(b"x" * 100 + SECRET.encode() + b"y" * 70_000 + ending)
    writer.close()
    budget = 70_000 + len(SECRET) // 2 + len(ending)  # the window begins inside the secret
    for lines in (5, None):
        shown = MASK(JobLog(log, None).tail(lines, budget))
        assert _fragments(shown) == [], shown[:200]
    if newline_at_the_end:
        assert JobLog(log, None).tail(5, budget) == "last line\n"


def test_a_followed_job_s_last_line_is_shown_even_without_its_end(tmp_path: Path, local_backend: LocalBackend) -> None:
    """A follower waits for a line's end; a job's last line may never get one (``printf`` without
    ``\\n``): once the job has ended, it is shown."""
    ref = local_backend.submit(make_plan(tmp_path, script="echo first; printf 'the last, unended'")).backend_ref
    assert finished(local_backend, ref).state == "COMPLETE"
    cursor, shown = json.dumps({"0": 0}), ""
    for _ in range(10):
        chunk = local_backend.follow_logs(ref, cursor)
        shown, cursor = shown + chunk.text, chunk.cursor
    assert shown == "first\nthe last, unended"
