#!/bin/sh
# A stand-in for a TAO training action, for the local compute frame's tests, demo and benchmark.
# POSIX sh only: the frame runs this host's userland, which may have no Python.
#
# Usage: sh train.sh -e SPEC
#
#   -e SPEC            the action's config file, as TAO takes it; it must be a readable, non-empty file
#
# Environment (all optional but TAO_RESULTS_DIR):
#   TAO_RESULTS_DIR    where results go (set by every launch plan)
#   TRAIN_INPUTS       colon-separated paths to read in full before training, as a data loader would;
#                      a missing, empty or unreadable one is a clear error (exit 2)
#   EPOCHS             how many epochs (default 3); each writes checkpoint_epoch_N.pth, and a run that
#                      finds checkpoints in the results directory resumes after the newest, as TAO does
#   EPOCH_SECONDS      how long each epoch takes (default 1; fractions work where sleep takes them)
#   FAIL_AFTER_EPOCH   fail after writing this epoch's checkpoint ...
#   FAIL_EXIT_CODE     ... with this exit code (default 1)
#   MARKER_DIR         if set, a line "rank N started" is appended to $MARKER_DIR/started first thing:
#                      proof, from outside, that the command started (and how often)
#   HOLD_FILE          if set, wait until this path exists before the first epoch (holds a job RUNNING)
#   NODE_RANK ...      the rendezvous variables of a multi-node job (TAO's and torchrun's PET_*) are
#                      printed; only rank 0 writes results, as TAO does
#
# Results: checkpoint_epoch_N.pth, status.json (one JSON line per event, like TAO's), train.log,
# and .tao/state.json (job state that is never uploaded).

set -u

rank=${NODE_RANK:-0}
say() { printf '%s\n' "train.sh[rank $rank]: $*"; }
fail() { code=$1; shift; printf '%s\n' "train.sh[rank $rank]: error: $*" >&2; exit "$code"; }

spec=""
while [ $# -gt 0 ]; do
  case "$1" in
    -e) [ $# -ge 2 ] || fail 2 "-e needs a path"; spec=$2; shift 2 ;;
    *) fail 2 "unknown argument '$1' (usage: train.sh -e SPEC)" ;;
  esac
done

if [ -n "${MARKER_DIR:-}" ]; then
  printf 'rank %s started\n' "$rank" >> "$MARKER_DIR/started" || fail 2 "cannot write the marker in $MARKER_DIR"
fi
say "rendezvous: WORLD_SIZE=${WORLD_SIZE:-} NUM_GPU_PER_NODE=${NUM_GPU_PER_NODE:-} NODE_RANK=${NODE_RANK:-} MASTER_ADDR=${MASTER_ADDR:-} MASTER_PORT=${MASTER_PORT:-} PET_NNODES=${PET_NNODES:-} PET_NPROC_PER_NODE=${PET_NPROC_PER_NODE:-} PET_NODE_RANK=${PET_NODE_RANK:-} PET_MASTER_ADDR=${PET_MASTER_ADDR:-} PET_MASTER_PORT=${PET_MASTER_PORT:-}"

[ -n "$spec" ] || fail 2 "no spec: pass -e SPEC"
[ -f "$spec" ] || fail 2 "the spec $spec does not exist or is not a file"
[ -s "$spec" ] || fail 2 "the spec $spec is empty"
cat "$spec" > /dev/null 2>&1 || fail 2 "the spec $spec is not readable"
say "spec $spec read"

read_input() {
  if [ ! -e "$1" ]; then fail 2 "input $1 does not exist"; fi
  if [ -d "$1" ]; then
    [ -n "$(find "$1" -type f 2>/dev/null | head -n 1)" ] || fail 2 "input $1 holds no file"
    find "$1" -type f -exec cat {} + > /dev/null || fail 2 "input $1 is not readable in full"
  else
    cat "$1" > /dev/null 2>&1 || fail 2 "input $1 is not readable"
  fi
  say "input $1 read"
}
set -f  # the inputs are paths, never patterns
old_ifs=$IFS
IFS=:
for input in ${TRAIN_INPUTS:-}; do
  IFS=$old_ifs
  read_input "$input"
done
IFS=$old_ifs
set +f

if [ -n "${HOLD_FILE:-}" ]; then
  say "waiting for $HOLD_FILE"
  while [ ! -e "$HOLD_FILE" ]; do sleep 0.1; done
fi

epochs=${EPOCHS:-3}
epoch_seconds=${EPOCH_SECONDS:-1}
results=${TAO_RESULTS_DIR:-}
[ -n "$results" ] || fail 2 "TAO_RESULTS_DIR is not set"
writer=false
if [ "$rank" = 0 ]; then
  writer=true
  mkdir -p "$results/.tao" || fail 2 "cannot write to the results directory $results"
fi

event() {  # status, epoch, message[, extra JSON members]: one line as TAO's status logger writes it
  $writer || return 0
  printf '{"date": "%s", "time": "%s", "status": "%s", "verbosity": "INFO", "epoch": %s, "max_epoch": %s, "message": "%s"%s}\n' \
    "$(date -u +%-m/%-d/%Y)" "$(date -u +%-H:%-M:%-S)" "$1" "$2" "$epochs" "$3" "${4:-}" >> "$results/status.json"
  printf '%s %s epoch %s/%s: %s\n' "$(date -u +%H:%M:%S)" "$1" "$2" "$epochs" "$3" >> "$results/train.log"
}

kpis() {  # epoch: a loss that falls and an accuracy that rises, with the epoch's time and what is left
  awk -v e="$1" -v n="$epochs" -v s="$epoch_seconds" 'BEGIN {
    printf ", \"time_per_epoch\": %s, \"eta\": %s, \"kpi\": {\"loss\": %.4f, \"accuracy\": %.4f}", s, (n - e) * s, 1 / (e + 1), 1 - 1 / (e + 2) }'
}

# As TAO does: resume from the newest checkpoint in the results directory (a later attempt's,
# restored there before the command starts).
epoch=1
for checkpoint in "$results"/checkpoint_epoch_*.pth; do
  [ -f "$checkpoint" ] || continue
  done_epoch=${checkpoint##*_epoch_}
  done_epoch=${done_epoch%.pth}
  case "$done_epoch" in *[!0-9]*|'') continue ;; esac
  if [ "$done_epoch" -ge "$epoch" ]; then epoch=$((done_epoch + 1)); fi
done
if [ "$epoch" -gt 1 ]; then
  event STARTED $((epoch - 1)) "resumed from checkpoint_epoch_$((epoch - 1)).pth"
  say "resumed from checkpoint_epoch_$((epoch - 1)).pth"
else
  event STARTED 0 "training started"
fi
while [ "$epoch" -le "$epochs" ]; do
  sleep "$epoch_seconds"
  if $writer; then
    printf 'stand-in weights, epoch %s\n' "$epoch" > "$results/.checkpoint.partial"
    mv "$results/.checkpoint.partial" "$results/checkpoint_epoch_$epoch.pth"
    printf '{"last_epoch": %s}\n' "$epoch" > "$results/.tao/state.json"
  fi
  event RUNNING "$epoch" "epoch $epoch done" "$(kpis "$epoch")"
  say "epoch $epoch/$epochs done"
  if [ "$epoch" = "${FAIL_AFTER_EPOCH:-}" ]; then
    event FAILURE "$epoch" "told to fail after epoch $epoch"
    fail "${FAIL_EXIT_CODE:-1}" "told to fail after epoch $epoch"
  fi
  epoch=$((epoch + 1))
done
event SUCCESS "$epochs" "training finished"
say "done"
