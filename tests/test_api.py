"""The public step API, the retry classification, and the rule that the core speaks in parameters
(never CLI flags) while the CLI translates."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

import tao_data_io
from tao_data_io.cli import in_cli_terms
from tao_data_io.credentials import forwarded_values
from tao_data_io.errors import (BackendError, CredentialError, IntegrityError, TransferError, UsageError,
                                is_retryable)
from tao_data_io.reporting import MAX_EXAMPLES, Progress, throttled
from tao_data_io.staging.selective import MissingReferencesError
from tao_data_io.transfer.summary import Failure, TransferSummary

PACKAGE = Path(tao_data_io.__file__).parent


def test_every_export_resolves_and_steps_results_have_to_dict_and_describe() -> None:
    for name in tao_data_io.__all__:
        assert getattr(tao_data_io, name) is not None
    for result_type in (tao_data_io.TransferSummary, tao_data_io.StagedSource, tao_data_io.StagingMap):
        assert callable(getattr(result_type, "to_dict")) and callable(getattr(result_type, "describe"))


def test_a_20000_file_summary_stays_small() -> None:
    summary = TransferSummary("s3://b/p/", "/d", transferred_files=20_000, transferred_bytes=1 << 30)
    summary.transferred = [f"dir/file-{i:05d}.bin" for i in range(20_000)]
    summary.failed = [Failure(f"bad-{i}", "503 SlowDown") for i in range(500)]
    data = summary.to_dict()
    assert len(json.dumps(data)) < 4000
    assert data["failed_files"] == 500 and len(data["failed"]) == MAX_EXAMPLES  # type: ignore[arg-type]


@pytest.mark.parametrize(("exc", "retry"), [
    (UsageError("bad"), False),
    (CredentialError("no key"), False),
    (TransferError("3 objects failed"), True),
    (IntegrityError("sha256 mismatch"), False),
    (MissingReferencesError("2 missing", [], TransferSummary("a", "b")), False),
    (BackendError("apiserver 503", retryable=True), True),
    (BackendError("admission refused"), False),
    (ConnectionResetError(), True),
    (TimeoutError(), True),
    (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
    (ClientError({"Error": {"Code": "SlowDown"}, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject"), True),
    (ClientError({"Error": {"Code": "AccessDenied"}, "ResponseMetadata": {"HTTPStatusCode": 403}}, "GetObject"), False),
    (ValueError("x"), False),
    (KeyError("x"), False),
])
def test_is_retryable(exc: BaseException, retry: bool) -> None:
    assert is_retryable(exc) is retry


def test_cli_terms_translate_parameters_only_where_the_verb_has_the_flag() -> None:
    flags = {"job_id": "--job-id", "force": "--force", "src_prefix": "--src-prefix"}
    assert in_cli_terms("job_id 'Bad' is not valid; replace it (force)", flags) == \
        "--job-id 'Bad' is not valid; replace it (--force)"
    assert in_cli_terms("inputs[0].job_id 'x' and my_job_id 'y'", flags) == "inputs[0].job_id 'x' and my_job_id 'y'"
    assert in_cli_terms("src_prefix 's3://b/p' is a URL", flags) == "--src-prefix 's3://b/p' is a URL"


def _string_constants_outside_docstrings(tree: ast.AST) -> list[tuple[int, str]]:
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_the_core_names_parameters_never_cli_flags() -> None:
    """A message shown in the Prefect UI must not say "pass --force"; commands/ translates."""
    import re

    flag = re.compile(r"(^|[\s`(])--[a-z][a-z-]+")
    # s5cmd's; bubblewrap's and nsenter's; setpriv's
    other_programs_argv = ("transfer/s5cmd_executor.py", "launch/sandbox.py", "launch/run_as.py",
                           "backends/slurm/script.py", "backends/slurm/commands.py")
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        # The renderer writes the command lines its pods run (the stage Job's argv) and the agents
        # are the frame's scripts: flags there are argv, not messages. The rest speaks to people.
        if (relative in ("cli.py", "backends/kubernetes/render.py", "launch/agents.py")
                or relative.startswith("commands/")):
            continue
        for line, text in _string_constants_outside_docstrings(ast.parse(path.read_text())):
            if flag.search(text) and relative not in other_programs_argv:
                offenders.append(f"{relative}:{line}: {text[:80]!r}")
    assert offenders == []


def test_forwarded_values_map_legacy_names_in_memory() -> None:
    env = {"ACCESS_KEY": "legacy-id-123", "AWS_SECRET_ACCESS_KEY": "aws-secret-456", "HF_TOKEN": "hf_abcdef"}
    assert forwarded_values(["AWS_ACCESS_KEY_ID", "SECRET_KEY", "HF_TOKEN"], env) == {
        "AWS_ACCESS_KEY_ID": "legacy-id-123", "SECRET_KEY": "aws-secret-456", "HF_TOKEN": "hf_abcdef"}
    with pytest.raises(CredentialError, match="NGC_KEY") as info:
        forwarded_values(["NGC_KEY", "HF_TOKEN"], env)
    assert "hf_abcdef" not in str(info.value)


def test_throttled_progress_passes_the_first_and_the_last() -> None:
    now = [0.0]
    seen: list[Progress] = []
    forward = throttled(seen.append, per_second=2, clock=lambda: now[0])
    for done in range(1, 101):
        now[0] += 0.01  # 100 updates in one second
        forward(Progress(100, 100, done, done, 0))
    assert [p.files_done for p in seen] == [1, 51, 100]


def test_every_error_of_ours_can_be_rebuilt_from_its_message() -> None:
    """Prefect stores a failed flow's exception as its class and message and rebuilds it as
    ``cls(message)`` when the result is read back (``run_deployment(...).state.result()``); an
    error class that needs more than its message breaks exactly that read."""
    import importlib
    import pkgutil

    import flows
    import tasks

    for package in (tao_data_io, flows, tasks):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.startswith(("tao_data_io.embedded", "tao_data_io.backends.local.runner")):
                continue  # entry points of child processes, not imported by steps
            importlib.import_module(module.name)
    from tao_data_io.errors import TaoDataIOError

    seen: list[type[BaseException]] = []
    pending: list[type[BaseException]] = [TaoDataIOError]  # what a step raises on purpose
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            if sub.__module__.split(".")[0] in ("tao_data_io", "flows", "tasks"):
                seen.append(sub)
    assert len(seen) >= 10, seen
    for error in seen:
        rebuilt = error("job x: the stored message")
        assert str(rebuilt) == "job x: the stored message", error
