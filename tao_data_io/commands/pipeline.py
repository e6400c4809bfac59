"""``submit``, ``status``, ``logs``, ``cancel``, ``collect``: a TAO job through its whole life from
a shell, running the same verbs as the Prefect flows (:mod:`tao_data_io.verbs`), each step called
directly.

Why verbs: not every user runs Prefect; a shell script, a CI job or an agent submits a request,
polls it and collects its results with the same guarantees (verify inside the frame before the
command starts, results uploaded with excludes even after a failure, the record as the source of
truth).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..vocabulary import DEFAULT_POLL_SECONDS, POLL_SECONDS_BOUNDS, WORKDIR_VARIABLE
from .examples import add_verb
from .record import add_root_option, seconds_type
from .target import add_target_options, target_settings

if TYPE_CHECKING:
    from ..console import Console
    from ..launch.backend import Backend
    from ..records import RecordStore

#: How often ``logs --follow`` looks for new output.
FOLLOW_SECONDS = 1.0


def register(verbs: Any) -> None:
    submit = add_verb(verbs, "submit", help="run a job request: record, tier, stage, config, launch, verify "
                                            "inside the frame, then RUNNING; prints the job id")
    submit.add_argument("--request", required=True, metavar="R", help="job request (YAML or JSON)")
    _add_common(submit)
    submit.add_argument("--json", action="store_true", help="print the submission as JSON")
    add_target_options(submit)  # last: a plugin's setting named as one of the verb's flags is in --target
    submit.set_defaults(run=_submit)

    status = add_verb(verbs, "status", help="a job's state in the TAO vocabulary (PENDING, RUNNING, COMPLETE, "
                                            "ERROR, CANCELED), recorded when final")
    _add_job(status)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(run=_status)

    logs = add_verb(verbs, "logs", help="the last lines of a job's output (per rank for multi-node jobs)")
    _add_job(logs)
    logs.add_argument("--tail", type=_whole_number, default=100, metavar="N", help="lines to show (default 100)")
    logs.add_argument("--follow", action="store_true",
                      help="after the last lines, show what the job prints until it ends")
    logs.set_defaults(run=_logs)

    cancel = add_verb(verbs, "cancel", help="stop a job and everything it started; the record says CANCELED")
    _add_job(cancel)
    cancel.set_defaults(run=_cancel)

    collect = add_verb(verbs, "collect", help="after the job: upload results to the recorded route with the "
                                              "job's excludes (also after a failure) and record the outcome")
    _add_job(collect)
    collect.add_argument("--wait", action="store_true", help="wait for the job to end (long PENDING is normal)")
    collect.add_argument("--poll-seconds", type=seconds_type("--poll-seconds", POLL_SECONDS_BOUNDS),
                         default=DEFAULT_POLL_SECONDS, metavar="S",
                         help=f"how often to ask while waiting (default {DEFAULT_POLL_SECONDS:g})")
    collect.add_argument("--json", action="store_true", help="print the outcome as JSON")
    collect.set_defaults(run=_collect)


def _whole_number(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--tail {text!r} must be a whole number of lines, 1 or more")
    return int(text)


def _add_common(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--workdir", type=Path, metavar="W",
                     help=f"where jobs' working directories live on this host (default ${WORKDIR_VARIABLE} or "
                          "~/.tao-data-io/work); give the same one to every verb of a job")
    add_root_option(sub)


def _add_job(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--job-id", required=True, metavar="ID")
    _add_common(sub)


def _job(args: argparse.Namespace, console: Console) -> tuple[RecordStore, Backend, str]:
    """The job's store and backend: the backend as recorded at submit, unless the command line
    says otherwise (``--workdir``). From here on the console masks the values of the job's
    forwarded credentials too: the job may print them, whatever they are called."""
    from ..backends import settings_model
    from ..redaction import Redactor
    from ..records import RecordStore
    from ..steps import backend_of, staging_root

    store = RecordStore(args.root)
    record = store.get(args.job_id)
    console.redact = Redactor(secret_names=record.forward_env)
    workdir = staging_root(args.workdir) if args.workdir is not None or not record.backend_config else None
    overrides = settings_model(record.backend).from_workdir(workdir) if workdir is not None else {}
    return store, backend_of(record, overrides), record.job_id


def _submit(args: argparse.Namespace, console: Console) -> int:
    from ..backends import backend_for
    from ..redaction import Redactor
    from ..records import RecordStore
    from ..request import load_request
    from ..steps import staging_root
    from ..verbs import submit

    request = load_request(args.request)
    console.redact = Redactor(secret_names=request.forward_env)
    backend = backend_for(args.backend, target_settings(args, workdir=staging_root(args.workdir)))
    done = submit(request, backend, RecordStore(args.root), staging_root=args.workdir, say=console.err)
    if args.json:
        console.json(done.to_dict())
    else:
        console.err(done.describe())
        console.out(done.job_id)
    return 0


def _status(args: argparse.Namespace, console: Console) -> int:
    from ..steps import observe_and_record

    store, backend, job_id = _job(args, console)
    status = observe_and_record(store.get(job_id), backend, store)
    console.json(status.to_dict()) if args.json else console.out(status.describe())
    return 0


def _logs(args: argparse.Namespace, console: Console) -> int:
    store, backend, job_id = _job(args, console)
    ref = store.get(job_id).backend_ref
    if ref is None:
        console.out(f"job {job_id} was never launched")
        return 0
    if not args.follow:
        console.out(backend.logs(ref, args.tail).rstrip("\n"))
        return 0
    import time

    from ..redaction import StreamRedactor
    from ..steps import new_log

    printed = StreamRedactor(console.redact)  # a look may end inside a long line: a secret across it is masked whole
    cursor = None
    while True:  # after the job's end, the last look reads on until nothing is new
        ended = backend.status(ref).state not in ("PENDING", "RUNNING")  # over, or no longer known there
        for chunk in new_log(backend, ref, cursor, to_the_end=ended):
            shown = printed.feed(chunk.text)
            if shown:
                console.out(shown.removesuffix("\n"))
            cursor = chunk.cursor
        if ended:
            rest = printed.end()
            if rest:
                console.out(rest.removesuffix("\n"))
            return 0
        time.sleep(FOLLOW_SECONDS)


def _cancel(args: argparse.Namespace, console: Console) -> int:
    from ..verbs import cancel

    store, backend, job_id = _job(args, console)
    console.out(cancel(job_id, backend, store).describe())
    return 0


def _collect(args: argparse.Namespace, console: Console) -> int:
    from ..routing import loud_ephemeral_warning
    from ..verbs import collect

    store, backend, job_id = _job(args, console)
    outcome = collect(job_id, backend, store, wait=args.wait, poll_seconds=args.poll_seconds, environ=os.environ,
                      say=console.err)
    if args.json:
        console.json(outcome.to_dict())
    else:
        console.out(outcome.describe())
        if outcome.upload is not None and outcome.upload.summary is not None:
            from .transfer import report

            report(outcome.upload.summary, console, as_json=False, lines_only=True)  # each skip and failure, named
        if outcome.logs_tail:
            console.out("last lines of the log:\n" + outcome.logs_tail.rstrip("\n"))
        if outcome.failure is not None:
            console.out(f"failure analysis: {outcome.failure.describe()}")
    if outcome.upload is not None and outcome.upload.status == "ephemeral":
        console.err(loud_ephemeral_warning(job_id))
    if not outcome.finished:
        return 3  # not finished: a script polls again
    failed = outcome.upload is not None and outcome.upload.summary is not None and not outcome.upload.summary.ok
    return 1 if failed or outcome.state != "COMPLETE" else 0
