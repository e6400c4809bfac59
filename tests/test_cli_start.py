"""The command starts light: parsing imports nothing heavy, each verb imports what it needs when
it runs, and every verb's --help ends with numbered examples.

Why test imports rather than time: a start-up regression is almost always a heavy import moved
to module level (a time limit would be flaky on a shared machine); these tests name the module.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from tao_data_io.cli import build_parser
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.records import RecordStore

from .helpers import write_tree

#: Third-party packages no verb needs just to parse its command line.
HEAVY = {"boto3", "botocore", "s3transfer", "urllib3", "obstore", "pydantic", "pydantic_core", "yaml", "tomli_w",
         "pandas", "pyarrow", "rich", "huggingface_hub", "httpx", "httpx2"}
#: Our modules that pull those in, or large stdlib ones (tarfile, asyncio) a parse does not need.
HEAVY_OURS = {"tao_data_io.transfer.engine", "tao_data_io.record", "tao_data_io.request", "tao_data_io.outputs",
              "tao_data_io.staging", "tao_data_io.transfer.obstore_executor"}


def imported_by(argv: list[str], env: Mapping[str, str], *, run: bool = True) -> set[str]:
    """The modules a fresh interpreter has loaded after parsing ``argv`` (and running it, with
    ``run``): the same start-up a user's shell pays."""
    code = ("import json, sys\nfrom tao_data_io import cli\n"
            + ("code = cli.main(sys.argv[1:])\n" if run else
               "cli.build_parser().parse_args(sys.argv[1:]); code = 0\n")
            + "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\nsys.exit(code)\n")
    result = subprocess.run([sys.executable, "-c", code, *argv], env={"PATH": os.environ["PATH"], **env},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return set(json.loads(result.stderr.strip().splitlines()[-1]))


def roots(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_parsing_any_verb_imports_nothing_heavy() -> None:
    for argv in (["sync", "s3://b/p/", "d"], ["resync", "--job-id", "j", "--results-dir", "r"],
                 ["record", "list"], ["pull-model", "hf://org/repo", "--dest", "d"]):
        loaded = imported_by(argv, {}, run=False)
        assert not roots(loaded) & HEAVY, sorted(roots(loaded) & HEAVY)
        assert not {name for name in loaded if any(name == m or name.startswith(m + ".") for m in HEAVY_OURS)}


def test_the_top_level_help_and_a_mistyped_verb_load_no_backend_and_no_pydantic() -> None:
    """Both build every verb's parser to list the verbs; the flags made from the backends'
    settings models (their registry and pydantic: ~200 ms of imports) wait until a verb is used,
    and the list still names every verb."""
    code = ("import json, sys\nfrom tao_data_io import cli\n"
            "try:\n    cli.build_parser().parse_args(sys.argv[1:])\nexcept BaseException:\n    pass\n"
            "print(json.dumps(sorted(sys.modules)), file=sys.stderr)\n")
    for argv in (["--help"], ["sumbit", "--request", "r.yaml"]):
        result = subprocess.run([sys.executable, "-c", code, *argv], env={"PATH": os.environ["PATH"]},
                                capture_output=True, text=True, timeout=120)
        loaded = set(json.loads(result.stderr.strip().splitlines()[-1]))
        assert not roots(loaded) & HEAVY and "tao_data_io.backends" not in loaded, argv
    listed, verbs = build_parser().format_help(), _named_choices(build_parser())
    assert len(verbs) == 20 and all(verb in listed for verb in verbs)


def _named_choices(parser: argparse.ArgumentParser) -> set[str]:
    return next(set(action.choices) for action in parser._actions if isinstance(action, argparse._SubParsersAction))


def test_a_download_sync_needs_neither_botocore_nor_the_record(s3_server: EmbeddedS3, s3_client, bucket: str,  # type: ignore[no-untyped-def]
                                                               tmp_path: Path) -> None:
    s3_client.put_object(Bucket=bucket, Key="p/a.txt", Body=b"a")
    loaded = roots(imported_by(["sync", f"s3://{bucket}/p/", str(tmp_path / "d")], {**s3_server.env(),
                                                                                     "HOME": str(tmp_path)}))
    assert (tmp_path / "d" / "a.txt").read_bytes() == b"a"
    assert "obstore" in loaded  # the bytes moved in-process
    assert not loaded & (HEAVY - {"obstore"}), sorted(loaded & HEAVY)


def test_a_resync_loads_the_record_but_not_botocore(s3_server: EmbeddedS3, bucket: str, tmp_path: Path) -> None:
    jobs = RecordStore(tmp_path / "jobs")
    write_tree(tmp_path / "results", {"model.pth": b"w"})
    jobs.open(job_id="start-light", backend="test", image="tao", network_arch="dino", action="train",
              storage_tier="B", results_dir=str(tmp_path / "results"))
    env = {**s3_server.env(), "HOME": str(tmp_path), "S3_BUCKET_NAME": bucket,
           "TAO_DATA_IO_JOBS_DIR": str(tmp_path / "jobs")}
    resync = ["resync", "--job-id", "start-light", "--results-dir", str(tmp_path / "results"), "--settle-seconds", "0"]
    imported_by(resync, env)  # the job's first upload claims its prefix: one conditional PUT, through boto3
    write_tree(tmp_path / "results", {"model.pth": b"w2"})
    modules = imported_by(resync, env)
    loaded = roots(modules)
    assert jobs.get("start-light").uploads[-1]["uploaded_files"] == 1
    assert "pydantic" in loaded and not loaded & {"boto3", "botocore", "s3transfer", "pandas", "pyarrow", "yaml",
                                                  "huggingface_hub", "rich"}
    assert "tao_data_io.request" not in modules  # the results limit is arithmetic, not the request model


def test_a_state_report_touches_no_storage_library(tmp_path: Path) -> None:
    env = {"TAO_DATA_IO_JOBS_DIR": str(tmp_path)}
    RecordStore(tmp_path).open(job_id="mark-light", backend="test", image="tao", network_arch="dino",
                               action="train", storage_tier="B", results_dir="/results")
    loaded = imported_by(["record", "mark", "mark-light", "--state", "RUNNING"], env)
    assert not roots(loaded) & {"boto3", "botocore", "obstore", "pandas", "pyarrow", "yaml", "huggingface_hub"}
    assert "tao_data_io.transfer.engine" not in loaded


def verb_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every (sub)command parser below ``parser``, nested ones (``record open``) included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                yield sub
                yield from verb_parsers(sub)


def test_every_verb_help_ends_with_numbered_examples_of_itself() -> None:
    parsers = list(verb_parsers(build_parser()))
    assert len(parsers) >= 15  # 11 verbs and the 4 actions of `record`
    for sub in parsers:
        text = sub.format_help()
        assert "\nExamples:\n" in text, sub.prog
        examples = text.split("\nExamples:\n", 1)[1]
        numbers = re.findall(r"^  (\d+)\. \S", examples, flags=re.M)
        commands = re.findall(r"^     > (.+)$", examples, flags=re.M)
        assert 2 <= len(numbers) <= 3 and numbers == [str(n) for n in range(1, len(numbers) + 1)], sub.prog
        assert len(commands) == len(numbers) and all(sub.prog in command for command in commands), sub.prog


def test_every_example_parses_as_its_help_shows_it() -> None:
    """An example is typed as shown: its flags exist, its required ones are there (a render-job
    example without its --stager-image read as a complete command line and failed)."""
    import shlex

    from tao_data_io.backends import declarations
    from tao_data_io.commands.examples import catalogue

    parser = build_parser()
    for verb, examples in catalogue().items():
        for _, command in examples:
            ours = re.search(r"tao-data-io ([^|>)]*)", command)  # in a pipe, a redirect or a $(…) too
            assert ours and ours[1].startswith(verb), command
            try:
                args = parser.parse_args(shlex.split(ours[1]))
            except SystemExit:
                raise AssertionError(f"the example does not parse: {command}") from None
            if getattr(args, "backend", None):  # a record of no backend: no later verb reaches its job
                assert args.backend in declarations(), command
