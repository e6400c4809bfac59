"""The verify probe: proof, from inside the compute frame, that every input is readable and the
results directory is writable and persists — before the training command starts.

Why inside the frame: a green check on the launcher proves nothing about the pod (managed
backends inject different credentials; a PVC path on a worker is not the PVC in the pod). So
both backends run the same static POSIX ``sh`` script *inside the frame*, with the same mounts
as the training command:

* the checklist is a file (one ``check<TAB>path<TAB>argument`` line per check), mounted
  read-only beside the script — no value is ever spliced into shell text or argv;
* the script prints one ``TAO-VERIFY<TAB>ok|fail<TAB>check<TAB>path<TAB>detail`` line per check
  and exits non-zero if any failed, so the training command never starts;
* persistence is proved by the script writing a token file into the results directory and the
  backend seeing it *from outside* the frame (then removing it): a directory that vanishes with
  the container would pass a plain writability test. Where results persist only through an
  upload (Kubernetes tier C), a ``persistent`` check reads the verdict another step of the frame
  wrote (the stager put and deleted an object under the results prefix with the frame's own
  credentials), so it joins this verdict;
* where the backend binds host paths by name (Docker), it adds a ``bound`` check per mount made
  from the host (the object at the target, seen through the frame's root, is the one it checked
  at submit), so a source swapped between the check and the container's start fails the verdict —
  never asked of the frame, whose tools (``stat``, ``sh``) are the job's.

:func:`parse_probe_output` turns the lines into a :class:`Verdict` (per path: pass/fail and the
error text), which the launch stores in the job record.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import Field

from ..schema import Strict
from .plan import LaunchPlan

CheckKind = Literal["dir-nonempty", "file", "readable", "present", "results-writable", "persistent", "bound"]
#: Name of the token file the probe writes into the results directory.
TOKEN_FILE = ".tao-data-io-verify"
LINE_PREFIX = "TAO-VERIFY"
#: The kubelet reads at most the last 4 KiB of a container's termination message file
#: (``MaxContainerTerminationMessageLength``, pkg/kubelet/kuberuntime/kuberuntime_container.go
#: ``getTerminationMessage``): a one-container pod's whole budget.
TERMINATION_MESSAGE_LIMIT = 4096
#: What the kubelet keeps of all a pod's termination messages together
#: (``MaxPodTerminationMessageLogLength``, pkg/kubelet/container/runtime.go).
POD_TERMINATION_MESSAGES = 12288

PROBE_SCRIPT = r"""#!/bin/sh
# tao-data-io verify probe: runs inside the compute frame before the job's command.
# Usage: sh probe.sh CHECKLIST   (one "check<TAB>path<TAB>argument" line per check)
# Prints one "TAO-VERIFY<TAB>ok|fail<TAB>check<TAB>path<TAB>detail" line per check.
# The job's own PATH (an image's /opt/conda/bin, say) may not hold the tools used here.
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
export PATH
tab=$(printf '\t')
failed=0
report() { printf 'TAO-VERIFY\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4"; [ "$1" = ok ] || failed=1; }
nonempty() {
  for entry in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    if [ -e "$entry" ] || [ -L "$entry" ]; then return 0; fi
  done
  return 1
}
# An input check's argument, when given, is the directory its path must resolve inside
# (symlinks followed): a Kubernetes subPath that leaves its volume is refused by the kubelet.
outside() {
  [ -n "$2" ] || return 1
  resolved=$(readlink -f -- "$1" 2>/dev/null) || resolved=$(cd -P -- "$1" 2>/dev/null && pwd -P) || return 1
  case "$resolved" in "$2"|"$2"/*) return 1 ;; esac
  return 0
}
while IFS="$tab" read -r check path argument; do
  case "$check" in
    dir-nonempty|file|readable|present)
      if outside "$path" "$argument"; then
        report fail "$check" "$path" "resolves outside its volume (to $resolved): the kubelet refuses such a subPath"
        continue
      fi ;;
  esac
  case "$check" in
    dir-nonempty)
      if [ ! -e "$path" ]; then report fail "$check" "$path" "does not exist"
      elif [ ! -d "$path" ]; then report fail "$check" "$path" "is not a directory"
      elif [ ! -r "$path" ] || [ ! -x "$path" ]; then report fail "$check" "$path" "is not readable"
      elif ! nonempty "$path"; then report fail "$check" "$path" "is empty"
      else report ok "$check" "$path" "readable, not empty"; fi ;;
    file)
      if [ ! -e "$path" ]; then report fail "$check" "$path" "does not exist"
      elif [ ! -f "$path" ]; then report fail "$check" "$path" "is not a regular file"
      elif ! dd if="$path" of=/dev/null bs=1 count=1 2>/dev/null; then report fail "$check" "$path" "is not readable"
      else report ok "$check" "$path" "readable"; fi ;;
    readable)
      if [ ! -e "$path" ]; then report fail "$check" "$path" "does not exist"
      elif [ -d "$path" ]; then
        if [ ! -r "$path" ] || [ ! -x "$path" ]; then report fail "$check" "$path" "is not readable"
        elif ! nonempty "$path"; then report fail "$check" "$path" "is an empty directory"
        else report ok "$check" "$path" "readable directory, not empty"; fi
      elif dd if="$path" of=/dev/null bs=1 count=1 2>/dev/null; then report ok "$check" "$path" "readable"
      else report fail "$check" "$path" "is not readable"; fi ;;
    present)
      if [ ! -e "$path" ]; then report fail "$check" "$path" "does not exist"
      elif [ ! -r "$path" ]; then report fail "$check" "$path" "is not readable"
      else report ok "$check" "$path" "present"; fi ;;
    results-writable)
      if ! mkdir -p "$path" 2>/dev/null; then report fail "$check" "$path" "cannot be created"
      elif ! { rm -f "$path/.tao-data-io-verify"
               printf '%s' "$argument" > "$path/.tao-data-io-verify"; } 2>/dev/null; then
        report fail "$check" "$path" "is not writable"
      else report ok "$check" "$path" "writable (token written)"; fi ;;
    persistent)
      # Another step of the frame (the stager) proved results persist and left "ok|fail<TAB>detail".
      if [ ! -r "$argument" ]; then report fail "$check" "$path" "no upload check ran (no verdict at $argument)"
      else
        IFS="$tab" read -r status detail < "$argument"
        if [ "$status" = ok ]; then report ok "$check" "$path" "$detail"
        else report fail "$check" "$path" "${detail:-the upload check failed}"; fi
      fi ;;
    '') ;;
    *) report fail "$check" "$path" "unknown check" ;;
  esac
done < "$1"
exit "$failed"
"""


#: The subject of the checks of the results directory.
RESULTS_SUBJECT = "results"


class Check(Strict):
    kind: CheckKind
    path: str
    #: What the check is about, for people: the input URI or :data:`RESULTS_SUBJECT`.
    subject: str
    argument: str = ""


class CheckResult(Strict):
    kind: CheckKind
    path: str
    ok: bool
    detail: str
    subject: str = ""


class Verdict(Strict):
    """Per path: pass or fail, and why. ``ok`` only when every check passed and none is missing."""

    ok: bool
    checks: list[CheckResult] = Field(default_factory=list)
    #: Set when the probe could not run at all (it died, timed out, printed nothing).
    error: str | None = None

    @property
    def failures(self) -> list[CheckResult]:
        return [check for check in self.checks if not check.ok]

    def to_dict(self) -> dict[str, object]:
        return self.model_dump(mode="json")

    def describe(self) -> str:
        if self.error:
            return f"verify could not run: {self.error}"
        if self.ok:
            return f"verified inside the frame: {len(self.checks)} checks passed"
        shown = "; ".join(f"{c.path}: {c.detail}" for c in self.failures[:5])
        return f"verify failed inside the frame: {len(self.failures)} of {len(self.checks)} checks failed — {shown}"

    def termination_message(self, limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
        """The verdict as probe lines, failures first, cut to ``limit`` bytes (the pod's
        :func:`termination_budget`) with a count of what was left out — the same cut as the
        Kubernetes verify wrapper (:data:`.agents.VERIFY_SCRIPT`)."""
        ordered = self.failures + [check for check in self.checks if check.ok]
        lines: list[str] = []
        size = 0
        for index, check in enumerate(ordered):
            line = _line(check)
            rest = ordered[index:]
            tail = f"{LINE_PREFIX}\tmore\t{len(rest)} not shown, {sum(c.ok for c in rest)} of them passed\n"
            if size + len(line.encode()) + len(tail.encode()) > limit:
                lines.append(tail)
                break
            lines.append(line)
            size += len(line.encode())
        return "".join(lines)


def termination_budget(containers: int) -> int:
    """The bytes of a termination message that survive in a pod of ``containers`` containers (its
    initContainers, native sidecars among them, and its containers). The kubelet keeps the *first*
    ``MaxPodTerminationMessageLogLength / containers`` bytes of each container's message
    (pkg/kubelet/status/status_manager.go, ``normalizeStatus``), of the at most 4 KiB it read: a
    verdict longer than this loses its tail, and with it the line saying the rest passed."""
    return min(TERMINATION_MESSAGE_LIMIT, POD_TERMINATION_MESSAGES // max(containers, 1))


def checklist(plan: LaunchPlan, token: str | None = None, located: Mapping[str, str] | None = None, *,
              within: str | None = None) -> tuple[list[Check], str]:
    """The checks for ``plan`` and the persistence token the results check writes. ``located``
    maps a mount target to where the probe reads it instead (a Kubernetes claim's pre-positioned
    input, read from above: a container that mounted its subPath would have the kubelet create it
    when missing), and such a path must resolve, symlinks and all, inside ``within`` (the
    kubelet refuses a subPath that leaves its volume); by default the probe reads each input
    where the job will."""
    token = token or secrets.token_hex(16)
    checks: list[Check] = []
    seen: set[str] = set()
    for mount in plan.mounts:
        if mount.target in seen:
            continue
        seen.add(mount.target)
        kinds: dict[str, CheckKind] = {"dir": "dir-nonempty", "file": "file", "any": "readable"}
        kind = kinds[mount.expect]
        if mount.expect == "any" and not mount.read_only:
            kind = "present"  # a writable mount is somewhere the job writes: it may start empty
        path = (located or {}).get(mount.target)
        checks.append(Check(kind=kind, path=path or mount.target, subject=mount.input,
                            argument=(within or "") if path else ""))
    checks.append(Check(kind="results-writable", path=plan.results_dir, subject=RESULTS_SUBJECT, argument=token))
    return checks, token


def checklist_text(checks: list[Check]) -> str:
    """The checklist file the script reads (paths were validated: no tab, newline or control character)."""
    return "".join(f"{check.kind}\t{check.path}\t{check.argument}\n" for check in checks)


def read_checklist(text: str, plan: LaunchPlan, located: Mapping[str, str] | None = None) -> list[Check]:
    """The checks of a checklist file (:func:`checklist_text`), their subjects from ``plan`` (and
    ``located``, as :func:`checklist` was given it) — what a frame was actually told to check, for
    a backend that reads the list back from the frame."""
    subjects = {(located or {}).get(mount.target, mount.target): mount.input for mount in plan.mounts}
    checks = []
    for line in text.splitlines():
        kind, path, argument = (line.split("\t") + ["", ""])[:3]
        if kind:
            subject = RESULTS_SUBJECT if path == plan.results_dir else subjects.get(path, path)
            checks.append(Check(kind=kind, path=path, subject=subject, argument=argument))
    return checks


def parse_probe_output(output: str, checks: list[Check], exit_code: int | None = None) -> Verdict:
    """Turn the probe's lines into a verdict. A check the probe never reported is a failure (the
    probe died mid-way), so a truncated run can never pass — unless the message says every line
    it left out passed (a termination message cut to its pod's :func:`termination_budget` lists
    failures first, and ends with a ``more`` line counting what it left out)."""
    subjects: dict[tuple[str, str], str] = {(c.kind, c.path): c.subject for c in checks}
    results: dict[tuple[str, str], CheckResult] = {}
    more: tuple[int, int] | None = None
    for line in output.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[:2] == [LINE_PREFIX, "more"]:
            counts = re.fullmatch(r"(\d+) not shown, (\d+) of them passed", parts[2])
            more = (int(counts[1]), int(counts[2])) if counts else None
            continue
        if len(parts) != 5 or parts[0] != LINE_PREFIX or parts[1] not in ("ok", "fail"):
            continue
        _, status, kind, path, detail = parts
        if (kind, path) in subjects:
            results[(kind, path)] = CheckResult(kind=kind, path=path, ok=status == "ok", detail=detail,
                                                subject=subjects[(kind, path)])
    if not results and checks:
        return Verdict(ok=False, error="the probe printed no verdict lines (did the frame start a POSIX sh?)")
    missing_ok, missing_detail = _unshown(more, sum((c.kind, c.path) not in results for c in checks))
    ordered = [results.get((c.kind, c.path)) or CheckResult(kind=c.kind, path=c.path, ok=missing_ok,
                                                              detail=missing_detail, subject=c.subject) for c in checks]
    lines_ok = all(r.ok for r in ordered)
    if exit_code not in (None, 0) and lines_ok:
        return Verdict(ok=False, checks=ordered,
                       error=f"the probe exited {exit_code} though every check it reported passed")
    return Verdict(ok=lines_ok, checks=ordered)


def ranks_verdict(verdicts: list[Verdict]) -> Verdict:
    """One verdict of a job's ranks' (each rank's, in rank order): ok when every one is; each
    check's detail, and each error, saying ``rank N:`` when there are several."""
    if len(verdicts) == 1:
        return verdicts[0]
    return Verdict(ok=all(v.ok for v in verdicts), error="; ".join(
        f"rank {rank}: {v.error}" for rank, v in enumerate(verdicts) if v.error) or None, checks=[
        check.model_copy(update={"detail": f"rank {rank}: {check.detail}"})
        for rank, v in enumerate(verdicts) for check in v.checks])


def with_persistence(verdict: Verdict, results_dir: str, seen_outside: bool, detail: str) -> Verdict:
    """Add the persistence check the backend made from outside the frame."""
    check = CheckResult(kind="persistent", path=results_dir, ok=seen_outside, detail=detail, subject=RESULTS_SUBJECT)
    return Verdict(ok=verdict.ok and seen_outside, checks=[*verdict.checks, check], error=verdict.error)


def _unshown(more: tuple[int, int] | None, missing: int) -> tuple[bool, str]:
    """Whether the ``missing`` checks the output did not report passed, and why: only when its
    ``more`` line (not shown, of them passed) accounts for exactly them and says all passed. Fewer
    passed: some of them failed — which, the cut message cannot say, so none reads as passed."""
    if more is None or more[0] != missing:
        return False, "not reported: the probe stopped before it"
    not_shown, passed = more
    if passed == not_shown:
        return True, "passed (not shown: the message was cut at its size limit)"
    return False, (f"not shown (the message was cut at its size limit): {not_shown - passed} of the {not_shown} "
                   "checks left out failed")


def _line(check: CheckResult) -> str:
    return f"{LINE_PREFIX}\t{'ok' if check.ok else 'fail'}\t{check.kind}\t{check.path}\t{check.detail}\n"


def remove_token(results: Path) -> None:
    """Remove the persistence token (:data:`TOKEN_FILE`) the probe left in the results directory at
    ``results`` once the host has read it, never through a link: a job's results hold no trace
    of the check."""
    try:
        fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.unlink(TOKEN_FILE, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)
