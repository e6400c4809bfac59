"""What the UI shows about a job, rendered from the core's results: pure functions, no Prefect.

Why separate from the tasks: the words and tables are the product's face in the Prefect UI and
are tested as plain strings; the tasks only publish them. Everything shown is names, paths,
counts and sizes — the same things the core's results hold — so nothing here can carry a secret
the results do not (and a job's own log lines are masked before they get here).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import yaml

from tao_data_io.launch.backend import FailureAnalysis, JobStatus
from tao_data_io.launch.probe import RESULTS_SUBJECT, CheckResult, Verdict
from tao_data_io.outputs import UploadOutcome, final_upload
from tao_data_io.records import JobRecord
from tao_data_io.reporting import human_size
from tao_data_io.request import JobRequest
from tao_data_io.staging.stage_map import StagedSource
from tao_data_io.vocabulary import ALWAYS_EXCLUDED


_DIGEST = re.compile(r"[0-9a-f]{64}")
#: A markdown code fence, and what one inside a fenced text is turned into (it would end the fence).
FENCE, SAFE_FENCE = "```", "'''"


def cell(value: object) -> str:
    """A markdown table cell: pipes escaped, one line."""
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def staged_rows(sources: Sequence[StagedSource]) -> list[dict[str, object]]:
    """One row per staged source: what it is, what staging did, then where from and where the job
    sees it (the long columns last; the config's 64-digit digest shortened)."""
    rows: list[dict[str, object]] = []
    for source in sources:
        if source.kind == "pre-positioned":
            outcome = "pre-positioned (tier A): nothing moves"
        elif source.files is None:
            outcome = source.note or "not staged here"
        elif source.moved:
            outcome = f"moved {source.transferred_files:,} files ({human_size(source.transferred_bytes)})"
            if source.unchanged_files:
                outcome += f", {source.unchanged_files:,} already there"
        else:
            outcome = "already there"
        rate = (f"{source.transferred_bytes / source.seconds / 1e6:.3g}"
                if source.moved and source.seconds > 0 else "")
        rows.append({"kind": source.kind, "files": "" if source.files is None else source.files,
                     "bytes": "" if source.bytes is None else human_size(source.bytes), "moved": outcome,
                     "seconds": round(source.seconds, 2), "MB/s": rate, "source": _short(source.source),
                     "destination": _short(source.container_path)})
    return rows


def _short(text: str) -> str:
    """A SHA-256 in a name (the config's) cut to 12 digits: enough to tell configs apart."""
    return _DIGEST.sub(lambda match: match[0][:12] + "…", text)


def training_key(job_id: str) -> str:
    """The key of a job's KPI table artifact (the launch report names it)."""
    return f"training-{job_id}"


def request_report(request: JobRequest) -> str:
    """The request as it runs (its job id filled in), for the run's audit: what a run was given
    as a file path or a form is kept as what it read. It passed the credential checks, so it
    holds names and paths only."""
    text = yaml.safe_dump(request.model_dump(mode="json", exclude_none=True), sort_keys=False)
    return f"# Request of job `{request.job_id}`\n\n```yaml\n{text.replace(FENCE, SAFE_FENCE)}```\n"


def launch_report(record: JobRecord, verdict: Verdict) -> str:
    """The tier and why, the output route, and the verify verdict per path."""
    lines = [f"# Job `{record.job_id}`: {'verified, running' if verdict.ok else 'NOT STARTED: verify failed'}", ""]
    lines.append(f"**Storage tier {record.storage_tier}**: {record.storage_reason or 'no reason recorded'}")
    route = record.output_route
    if route is not None:
        lines += ["", f"**Output route `{route.route}`** → `{route.destination}`: {route.reason or ''}"]
    if verdict.ok:
        lines += ["", f"**Training**: the collect run shows the job's log as it prints it, TAO's progress (epochs, "
                      f"time left) and the KPIs epoch by epoch in the artifact `{training_key(record.job_id)}`"]
    said = verdict.describe()
    lines += ["", f"## {said[0].upper()}{said[1:]}", ""]
    lines += [_check_item(check) for check in verdict.failures + [c for c in verdict.checks if c.ok]]
    return "\n".join(lines) + "\n"


def _check_item(check: CheckResult) -> str:
    """One check as a list item, which wraps in the artifact's column (a table of five columns ran
    past it, its last column hidden under the page's side panel); the input it proves, if any."""
    source = "" if check.subject in ("", check.path, RESULTS_SUBJECT) else f" (input {_code(_short(check.subject))})"
    return (f"- {'pass' if check.ok else '**FAIL**'} {_code(_short(check.path))} {check.kind}: "
            f"{check.detail.replace(chr(10), ' ')}{source}")


def _code(text: str) -> str:
    """``text`` as inline code on one line, however many backticks it holds (CommonMark: a run of
    backticks longer than any inside delimits it)."""
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text.replace(chr(10), ' ')} {fence}" if "`" in text else f"`{text.replace(chr(10), ' ')}`"


def upload_report(record: JobRecord, outcome: UploadOutcome) -> str:
    """Where the results went, what moved, and what was left out and by which rule."""
    lines = [f"# Results of job `{record.job_id}` ({record.state})", "", outcome.describe(), ""]
    rules = [ALWAYS_EXCLUDED + " (always: TAO's own state)",
             *(f"{pattern} (the request's upload_excludes)" for pattern in record.upload_excludes)]
    lines += ["Excluded by: " + "; ".join(f"`{rule.split(' ', 1)[0]}` {rule.split(' ', 1)[1]}" for rule in rules)]
    summary = outcome.summary
    if summary is not None:
        lines += ["", table(["uploaded", "bytes", "already there", "excluded", "skipped", "failed"],
                            [[summary.transferred_files, human_size(summary.transferred_bytes),
                              summary.unchanged_files, summary.excluded_files, summary.skipped_files,
                              summary.failed_files]])]
        if summary.failed:
            lines += ["", "Failed (first 20): " + ", ".join(f"`{f.name}`: {f.reason}" for f in summary.failed[:20])]
    return "\n".join(lines) + "\n"


def _end_table(status: JobStatus) -> str:
    code = "not known" if status.exit_code is None else status.exit_code
    return table(["state", "exit code", "message"], [[status.state, code, status.message or ""]])


def _ended(job_id: str, status: JobStatus) -> str:
    """``job X ended ERROR (exit code 3): <the backend's message>`` (the code once: the message may say it)."""
    code = ("" if status.exit_code is None or f"exit code {status.exit_code}" in status.message
            else f" (exit code {status.exit_code})")
    return f"job {job_id} ended {status.state}{code}" + (f": {status.message}" if status.message else "")


def ended_line(job_id: str, status: JobStatus, watcher: str | None) -> str:
    """What the scheduled resync says of a RUNNING job it found ended: the end, and what to do —
    nothing when a run still watches it (``watcher``: that run collects it), else a collect."""
    said = _ended(job_id, status)
    if watcher is not None:
        return f"{said}; its end is recorded, and the run that watches it ({watcher}) collects it"
    why = " and report why it failed" if status.state == "ERROR" else ""
    return (f"{said}; nothing collected it, and its end is recorded now: run collect-tao-job with job_id {job_id} "
            f"to upload its results{why}")


def ended_report(job_id: str, status: JobStatus, watcher: str | None) -> str:
    """The resync's ``ended-<job>`` artifact: the end it found and recorded, and what to do."""
    lines = [f"# Job `{job_id}` ended {status.state}", "", _end_table(status), "",
             "Its record said RUNNING: the scheduled resync found its end and recorded it."]
    if watcher is not None:
        lines += ["", f"**Next**: nothing to do: the run that watches it (`{watcher}`) collects it."]
    else:
        why = " and reports why it failed (the analysis, the log's last lines)" if status.state == "ERROR" else ""
        lines += ["", f"**Next**: run `collect-tao-job` with `job_id` `{job_id}`: it uploads the rest of its results "
                      f"(the final upload){why}."]
    return "\n".join(lines) + "\n"


def results_line(record: JobRecord) -> str:
    """Where a job's results are once it was collected: uploaded (its final upload), on a mount,
    or not kept; or not all uploaded yet."""
    route = record.output_route
    if route is None:
        return "no output route recorded"
    if route.route == "s3":
        if final_upload(record, route.destination) is not None:
            return f"uploaded to {route.destination}"
        return f"not all uploaded to {route.destination}: collect-tao-job with job_id {record.job_id} uploads them"
    if route.route == "mount":
        return f"on the mount at {route.destination}"
    return f"not kept ({route.route}: {route.reason or route.destination})"


def job_line(record: JobRecord, status: JobStatus, collect_run: str) -> str:
    """What ``run-tao-job`` says in its own log of how its job ended, and where its results are."""
    return (f"{_ended(record.job_id, status)}; its results: {results_line(record)} (its log, progress and "
            f"reports: the collect run {collect_run}, and this run's artifact job-{record.job_id})")


def job_report(record: JobRecord, status: JobStatus, collect_run: str,
               links: dict[str, str] | None = None) -> str:
    """``run-tao-job``'s ``job-<job>`` artifact, on its own page: how the job ended, where its
    results are, and where its collect run shows the rest (the log, the progress, the reports) —
    each named, and a link where ``links`` has one (by the name shown)."""
    def named(name: str) -> str:
        return f"[`{name}`]({links[name]})" if links and name in links else f"`{name}`"

    job_id = record.job_id
    lines = [f"# Job `{job_id}` ended {status.state}", "", _end_table(status), "",
             f"**Results**: {results_line(record)}; what moved and what was left out: the artifact "
             f"{named(f'results-{job_id}')}"]
    if status.state == "ERROR":
        lines += ["", f"**Why it failed**: the artifact {named(f'failure-{job_id}')} (the analysis and the log's "
                      "last lines)"]
    lines += ["", f"**The job's log and TAO's progress**: the collect run {named(collect_run)}; the KPIs epoch by "
                  f"epoch, when TAO wrote any: the artifact {named(training_key(job_id))}"]
    return "\n".join(lines) + "\n"


def failure_report(job_id: str, status: JobStatus, analysis: FailureAnalysis | None, tail: str | None) -> str:
    """What TAO users look at after an ERROR: the class, the reason, a fix, and the log's end."""
    lines = [f"# Job `{job_id}` ended {status.state}", "", status.describe()]
    if analysis is not None:
        lines += ["", f"**{analysis.err_class}**: {analysis.reason}", "", f"Fix: {analysis.suggestion}"]
    if tail:
        lines += ["", "## Last lines of the log", "", "```", tail.rstrip("\n").replace(FENCE, SAFE_FENCE), "```"]
    return "\n".join(lines) + "\n"
