"""The frame-side agents: the static POSIX ``sh`` scripts that run inside a job's compute frame
beside its command — the verify wrapper, the stager, the training wrapper, the results sidecar
and the status follower — whichever backend ships them there (the Kubernetes backend in the job's
ConfigMap; a Docker or SLURM backend in its own way).

Why static and here: every value they need (job id, paths, intervals, the shard) reaches them
through the environment the backend sets, so no value is ever spliced into shell text or argv —
the same rule as the verify probe (:data:`tao_data_io.launch.probe.PROBE_SCRIPT`), which is shipped
beside them unchanged; and they belong to the launch seam, below every backend, so a backend
reuses them without importing another backend. What they say of Kubernetes below is where the
Kubernetes backend is their first user: the signals and files they rely on are POSIX.
"""

from __future__ import annotations

from .probe import TERMINATION_MESSAGE_LIMIT

#: The last initContainer of the training pod (training image): runs the probe, prints its lines,
#: writes the verdict to the termination message and exits non-zero on any failure, so training
#: never starts. The message lists failures first and is cut, with a ``more`` line counting what it
#: left out, to the bytes the kubelet keeps of it in this pod (LIMIT, the renderer's
#: :func:`tao_data_io.launch.probe.termination_budget`; 4 KiB without it) — the same cut as
#: ``Verdict.termination_message``. A longer message would lose its tail to the kubelet, and a
#: passing verdict would read as a probe that stopped mid-way.
#: Usage: ``sh verify.sh PROBE CHECKLIST TERMINATION_FILE [LIMIT]``.
VERIFY_SCRIPT = r"""#!/bin/sh
# tao-data-io verify: the probe's verdict into the termination message, failures first.
# The image's PATH (set by the request, /opt/conda/bin say) may not hold awk: look in the usual places too.
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
export PATH
out=$(sh "$1" "$2")
code=$?
printf '%s\n' "$out"
tab=$(printf '\t')
printf '%s\n' "$out" | LC_ALL=C awk -F "$tab" -v limit="${4:-@LIMIT@}" '
  $1 == "TAO-VERIFY" && $2 == "fail" { fail[++nf] = $0 }
  $1 == "TAO-VERIFY" && $2 == "ok" { pass[++np] = $0 }
  END {
    n = 0
    for (i = 1; i <= nf; i++) { line[++n] = fail[i]; ok[n] = 0 }
    for (i = 1; i <= np; i++) { line[++n] = pass[i]; ok[n] = 1 }
    size = 0
    for (i = 1; i <= n; i++) {
      passed = 0
      for (j = i; j <= n; j++) passed += ok[j]
      tail = "TAO-VERIFY\tmore\t" (n - i + 1) " not shown, " passed " of them passed"
      if (size + length(line[i]) + 1 + length(tail) + 1 > limit) { print tail; exit }
      print line[i]
      size += length(line[i]) + 1
    }
  }' > "$3"
if [ "$code" = 0 ] && [ -z "$out" ]; then exit 1; fi
if [ "$code" = 0 ] && [ -n "${TAO_DATA_IO_VERDICT:-}" ]; then : > "$TAO_DATA_IO_VERDICT/passed" || exit 1; fi
exit "$code"
""".replace("@LIMIT@", str(TERMINATION_MESSAGE_LIMIT))

#: The first initContainer of a pod that stages its inputs (tier C) or uploads its results
#: (stager image): adopts the job record from the ConfigMap, proves uploads work with the pod's
#: own credentials (rank 0 only; the verdict file joins the probe's verdict), restores what
#: earlier attempts uploaded into the results (a later attempt's rank 0: TAO resumes from the
#: newest checkpoint), then stages.
STAGER_SCRIPT = r"""#!/bin/sh
# tao-data-io pod stager: the job record, the upload check, earlier attempts' results, the inputs.
set -u
tao-data-io record import "$TAO_DATA_IO_FILES/job-record.json" || exit 1
if [ -n "${TAO_DATA_IO_UPLOAD_CHECK:-}" ]; then
  if [ "${NODE_RANK:-0}" = 0 ]; then
    tao-data-io check-upload --job-id "$TAO_JOB_ID" --verdict "$TAO_DATA_IO_UPLOAD_CHECK" || true
  else
    printf 'ok\trank %s does not upload: rank 0 does\n' "$NODE_RANK" > "$TAO_DATA_IO_UPLOAD_CHECK"
  fi
fi
if [ -n "${TAO_DATA_IO_RESTORE_FROM:-}" ] && [ "${NODE_RANK:-0}" = 0 ]; then
  tao-data-io restore-results --from "$TAO_DATA_IO_RESTORE_FROM" --results-dir "$TAO_RESULTS_DIR" \
    --job-id "$TAO_JOB_ID" || exit 1
fi
if [ -n "${TAO_DATA_IO_STAGING_DIR:-}" ]; then
  exec tao-data-io stage --request "$TAO_DATA_IO_FILES/request.json" --staging-dir "$TAO_DATA_IO_STAGING_DIR" \
    --map "$TAO_DATA_IO_STATE/staging-map.json"
fi
"""

#: Wait for the frame's command (``$child``) to end, its status then in ``code``: a trapped signal
#: ends ``wait`` early (POSIX), so it waits again while the command lives — each frame's script
#: (the training wrapper here, the Docker frame, a SLURM rank) hands a signal on and waits so.
AWAIT_CHILD = r"""while :; do
  wait "$child"
  code=$?
  kill -0 "$child" 2>/dev/null && continue
  break
done
"""

#: The training container's PID 1: runs the job's command as its child and hands it SIGTERM.
#: Why: the kubelet signals only PID 1, and a TAO entry point there (Python, with no handler
#: installed) never sees SIGTERM — the kernel drops signals PID 1 has no handler for — so a cancel,
#: a preemption or a drain held the GPUs for the whole grace period, and the results sidecar, which
#: is stopped only after training exits, was left seconds for its final upload. The command's
#: words come after the script as its arguments ("$@"), never parsed by the shell. The command's
#: exit status is the container's, except once Kubernetes stopped it: then 143 (128 + SIGTERM),
#: whatever the command returned, so the pod failure policy can tell a stopped pod from a failed
#: one (:func:`.render.failure_policy`) — a Kueue preemption suspends the Job and stops its pods
#: with no condition on them, and the Job controller still judges them by the policy. A command
#: that exits 143 by itself exits 1 instead, said on stderr, so it is never taken for stopped. SIGINT
#: (an image's stop signal may be it) is handed on as SIGTERM: a shell starts a background command
#: with SIGINT ignored, and POSIX lets no trap give it back, so SIGINT itself would never stop it.
TRAIN_WRAPPER = r"""stopped=
trap 'stopped=1; kill -TERM "$child" 2>/dev/null' TERM INT
"$@" &
child=$!
""" + AWAIT_CHILD + r"""[ -n "$stopped" ] && exit 143
if [ "$code" = 143 ]; then
  echo "tao-data-io: the command exited 143 though Kubernetes did not stop it; exiting 1" \
    "(143 is a stopped command's code here)" >&2
  exit 1
fi
exit "$code"
"""

#: The results sidecar (stager image; a native sidecar: an initContainer with restartPolicy
#: Always, Kubernetes 1.29+). Resyncs while the job runs; Kubernetes sends it SIGTERM once the
#: training container has exited — succeeded or failed — and it then runs the final upload. Its
#: exit code never decides the Job's outcome. Only rank 0 uploads.
SIDECAR_SCRIPT = r"""#!/bin/sh
# tao-data-io results sidecar: once the verify probe has passed, resync every
# $TAO_DATA_IO_RESYNC_SECONDS, and the final upload on SIGTERM. A resync runs in the background so
# SIGTERM is handled at once (a shell runs a trap only after its foreground command): the one in
# flight is ended and the final upload starts. Nothing is uploaded unless the probe passed: a pod
# whose verify failed never ran the command, and its results are whatever an earlier attempt left.
set -u
if [ "${NODE_RANK:-0}" != 0 ]; then
  trap 'exit 0' TERM INT
  while :; do sleep 3600 & wait $!; done
fi
child=
final() {
  trap '' TERM INT  # once: a second signal (a shorter delete) must not start a second upload
  if [ -n "$child" ]; then kill "$child" 2>/dev/null; wait "$child" 2>/dev/null; fi
  if [ ! -e "$TAO_DATA_IO_VERDICT/passed" ]; then
    echo "tao-data-io: the verify probe did not pass, so the command never ran: no final upload" >&2
    exit 0
  fi
  tao-data-io upload-results --job-id "$TAO_JOB_ID" --results-dir "$TAO_RESULTS_DIR" \
    --exclude "$TAO_DATA_IO_VERIFY_FILE"
  exit $?
}
trap final TERM INT
while :; do
  if [ -e "$TAO_DATA_IO_VERDICT/passed" ]; then
    tao-data-io resync --job-id "$TAO_JOB_ID" --results-dir "$TAO_RESULTS_DIR" \
      --exclude "$TAO_DATA_IO_VERIFY_FILE" &
    child=$!
    wait "$child" || echo "tao-data-io: this resync failed or was ended; the next one retries" >&2
  fi
  sleep "$TAO_DATA_IO_RESYNC_SECONDS" &
  child=$!
  wait "$child"
  child=
done
"""

#: The status sidecar (training image, whose ``sh`` and ``tail`` the verify probe already needs; a
#: native sidecar on every tier): follows TAO's ``status.json`` into its own log, which the
#: collect run reads like any pod log — the file lives in the pod (or on a claim) where the
#: worker cannot read it. Waits for the file to appear; ``tail -F`` follows it through a rewrite.
#: It only prints what the job wrote, and the worker parses that with the same limits as a local
#: job's file (:mod:`tao_data_io.launch.training`). Kubernetes ends it once training has exited;
#: its SIGTERM ends the ``tail`` (or the ``sleep``) too, never leaving one behind.
STATUS_SCRIPT = r"""#!/bin/sh
# tao-data-io status sidecar: TAO's status.json, line by line, into this container's log.
PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}"
export PATH
child=
trap 'if [ -n "$child" ]; then kill "$child" 2>/dev/null; fi; exit 0' TERM INT
file="$TAO_RESULTS_DIR/$TAO_DATA_IO_STATUS_FILE"
while [ ! -f "$file" ]; do
  sleep "$TAO_DATA_IO_STATUS_SECONDS" &
  child=$!
  wait "$child"
done
tail -n +1 -F "$file" 2>/dev/null &
child=$!
wait "$child"
"""
