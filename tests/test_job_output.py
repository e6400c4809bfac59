"""What a job prints is hostile wherever it is shown: a credential it prints is masked whole even
where a look at its log ends inside a line longer than a look takes (the stream's masking, then
the CLI's ``logs --follow`` and the steps' watch of real jobs in the local frame), and its escape
sequences reach no terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tao_data_io.redaction import Redactor, StreamRedactor, mask_userinfo
from tao_data_io.launch.backend import FOLLOW_BYTES
from tao_data_io.records import RecordStore
from tao_data_io.steps import backend_of, wait_for_end

from .helpers import args_request, needs_bwrap, run_cli, write_request

#: Where a secret the job prints starts in its long line: it straddles the end of the first look.
BEFORE_THE_CUT = 20


def _secret() -> str:
    return f"wandb-{uuid.uuid4().hex}-k"  # 40 characters: 20 each side of the cut


def _pieces(secret: str) -> list[str]:
    """Every 8 characters of ``secret`` in a row: none may be shown."""
    return [secret[i:i + 8] for i in range(len(secret) - 7)]


def _straddling_request(tmp_path: Path, job_id: str, nodes: int = 1) -> Path:
    """A job that says ``ready``, waits for ``/control/go``, then prints one line longer than a look
    at its log takes (``A A A …``), with the forwarded ``WANDB_KEY`` across the place where that
    look ends — on each of its ``nodes`` ranks."""
    control = tmp_path / "control"
    control.mkdir(exist_ok=True)
    control.chmod(0o1777)
    script = ("echo ready; while [ ! -e /control/go ]; do sleep 0.1; done; "
              f"yes A | head -c {FOLLOW_BYTES - BEFORE_THE_CUT} | tr '\\n' ' '; printf %s \"$WANDB_KEY\"; "
              "head -c 100 /dev/zero | tr '\\0' B; echo; echo done")
    return write_request(tmp_path / f"{job_id}.yaml", args_request(
        job_id=job_id, command=["/bin/sh", "-c", script], forward_env=["WANDB_KEY"],
        compute_shape={"nodes": nodes, "shm_size": "64Mi"},
        mounts=[{"source": str(control), "target": "/control", "read_only": False}]))


#: Credentials whose values begin alike, and an endpoint with a password in its userinfo.
ENVIRON = {"HF_TOKEN": "hf_abcdefab", "WANDB_KEY": "abcdefXYZ-1", "AWS_ENDPOINT_URL": "https://user:p4ssw0rd@s3.test"}
FRAGMENTS = [*ENVIRON.values(), "user", "p4ss", "w0rd", "abc", "hf_", "https://", "http://x:y@", "://", ":", "/", "@",
             " ", "\n", "A" * 50]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_stream_cut_anywhere_is_shown_as_the_whole_text_masked_at_once(data: st.DataObject) -> None:
    redactor = Redactor(ENVIRON, secret_names=["WANDB_KEY"])
    text = "".join(data.draw(st.lists(st.sampled_from(FRAGMENTS) | st.text("abhtps:/@ ", max_size=4), max_size=30)))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    stream = StreamRedactor(redactor)
    shown = [stream.feed(text[start:end]) for start, end in zip([0, *cuts], [*cuts, len(text)])]
    assert "".join(shown) + stream.end() == redactor(text)


def test_whole_lines_are_shown_at_once_and_a_line_without_end_is_held_back_only_by_a_bound() -> None:
    stream = StreamRedactor(Redactor(ENVIRON, secret_names=["WANDB_KEY"]))
    assert stream.feed("epoch 1: abcdefXYZ-1 done\n") == "epoch 1: ***WANDB_KEY*** done\n"
    assert stream.feed("loss 0.5 abcdef") == "loss 0.5 "  # it may begin a credential
    assert stream.feed("XYZ-1\n") == "***WANDB_KEY***\n"
    assert len(stream.feed("A" * 100_000)) >= 100_000 - 4096  # a line without an end is not held whole


def test_a_url_glued_to_a_word_still_has_its_userinfo_masked() -> None:
    """A scheme starts after what a scheme cannot hold: an underscore is no word boundary to it."""
    assert mask_userinfo("LOG_https://user:pw@host/x é_http://a:b@h") == (
        "LOG_https://***USERINFO***@host/x é_http://***USERINFO***@h")


@needs_bwrap
def test_a_forwarded_secret_printed_across_the_cut_of_logs_follow_is_masked_whole(
        cli_env: dict[str, str], tmp_path: Path) -> None:
    secret = _secret()
    env = {**cli_env, "WANDB_KEY": secret}
    submitted = run_cli("submit", "--request", str(_straddling_request(tmp_path, "follow-cut")), env=env)
    assert submitted.returncode == 0, submitted.stderr
    follow = subprocess.Popen([sys.executable, "-m", "tao_data_io.cli", "logs", "--job-id", "follow-cut", "--follow"],
                              env={"PATH": os.environ["PATH"], **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert follow.stdout is not None
        first = follow.stdout.readline()  # the first look has been made: the long line comes after it
        assert first == "ready\n", first
        (tmp_path / "control" / "go").touch()
        rest, errors = follow.communicate(timeout=120)
    finally:
        follow.kill()
    assert follow.returncode == 0, errors
    shown = first + rest
    assert [piece for piece in _pieces(secret) if piece in shown + errors] == []
    assert "done" in shown.splitlines()
    masked_line = "A " * ((FOLLOW_BYTES - BEFORE_THE_CUT) // 2) + "***WANDB_KEY***" + "B" * 100
    assert masked_line in shown.replace("\n", "")  # whole, but for where a look ended


@needs_bwrap
@pytest.mark.parametrize("nodes", [1, 2], ids=["one-rank", "two-ranks"])
def test_a_forwarded_secret_printed_across_the_cut_of_a_look_reaches_the_watcher_masked_whole(
        cli_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: int) -> None:
    """What :func:`steps.wait_for_end` hands on as the job prints (the flows' live log). With two
    ranks, each line is ``[rank N]``'s, and the piece after a cut is its line's next piece: no
    other rank's line comes between them, where it would split the secret again."""
    secret = _secret()
    monkeypatch.setenv("WANDB_KEY", secret)
    submitted = run_cli("submit", "--request", str(_straddling_request(tmp_path, "watch-cut", nodes)),
                        env={**cli_env, "WANDB_KEY": secret})
    assert submitted.returncode == 0, submitted.stderr
    store = RecordStore(tmp_path / "jobs")
    backend = backend_of(store.get("watch-cut"))
    said: list[str] = []

    def on_log(text: str) -> None:
        said.append(text)
        if "ready" in text:  # the first look has been made: the long line comes after it
            (tmp_path / "control" / "go").touch()

    assert wait_for_end("watch-cut", backend, store, poll_seconds=0.2, timeout=120, on_log=on_log).state == "COMPLETE"
    shown = "\n".join(said)
    assert [piece for piece in _pieces(secret) if piece in shown] == []
    prefixes = [""] if nodes == 1 else ["[rank 0] ", "[rank 1] "]
    assert all(f"{prefix}done" in shown.splitlines() for prefix in prefixes)
    assert "more characters of this line not shown" in shown  # bounded
    assert shown.count("***WANDB_KEY***" + "B" * 100) == nodes


@needs_bwrap
def test_escape_sequences_a_job_prints_reach_the_watcher_escaped(cli_env: dict[str, str], tmp_path: Path) -> None:
    """A job's output retitles, clears or recolours no terminal and overwrites no line it is
    shown on: every control character but the line break and the tab is shown escaped."""
    script = r"printf 'title \033]0;owned\007 clear \033[2J\033[H red \033[31mred\033[0m\tback\rover\n'"
    request = write_request(tmp_path / "ansi.yaml", args_request(job_id="ansi", command=["/bin/sh", "-c", script]))
    submitted = run_cli("submit", "--request", str(request), env=cli_env)
    assert submitted.returncode == 0, submitted.stderr
    store = RecordStore(tmp_path / "jobs")
    said: list[str] = []
    assert wait_for_end("ansi", backend_of(store.get("ansi")), store, poll_seconds=0.2, timeout=120,
                        on_log=said.append).state == "COMPLETE"
    shown = "\n".join(said)
    assert shown == ("title \\x1b]0;owned\\x07 clear \\x1b[2J\\x1b[H red \\x1b[31mred\\x1b[0m\tback\\rover")


def test_a_url_cut_after_its_scheme_behind_a_bare_separator_is_masked_whole() -> None:
    """Hypothesis found it: a look that ends at ``http:`` right after a ``://`` with no scheme of
    its own (``…@://http:``) let the held-back check stop at that bare separator, so the next
    look's ``//x:y@`` showed the userinfo unmasked."""
    text = "http://x:y@://http://x:y@"
    stream = StreamRedactor(Redactor(ENVIRON, secret_names=["WANDB_KEY"]))
    shown = stream.feed(text[:19]) + stream.feed(text[19:]) + stream.end()
    assert shown == "http://***USERINFO***@://http://***USERINFO***@"
