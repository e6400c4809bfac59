"""The multi-node collective probe: before a multi-node job holds its GPUs, one short process per
node brings up a process group across the nodes and all-reduces a tensor, with a deadline: the
NCCL probe comes first, a two-node all-reduce with a timeout. A hang is the failure
multi-node training most often meets on a new cluster (the wrong network interface, RDMA that
does not reach, a NetworkPolicy), and inside TAO it shows as an epoch that never starts.

The probe runs in the job's own image with the rendezvous variables both backends render
(:mod:`.rendezvous`: ``WORLD_SIZE`` nodes, ``NODE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), one
process per node, on NCCL when the node has a GPU and gloo otherwise (the local frame's CPU
ranks). Its own alarm bounds every phase: a rank stuck in the rendezvous or the all-reduce prints
where it stopped and exits :data:`HANG_EXIT`, and :func:`read_probe` turns that into the NCCL
settings to try. Each line it prints is ``TAO-COLLECTIVE<TAB>ok|wrong|fail|hang<TAB>…``.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The prefix of every line the probe prints.
LINE_PREFIX = "TAO-COLLECTIVE"
#: The exit status of a rank whose probe hung (as ``timeout(1)`` has it).
HANG_EXIT = 124
#: How long a rank may take to join and all-reduce, unless told otherwise.
DEFAULT_TIMEOUT_S = 180
#: The settings a hang usually needs, for the request's ``environment`` (NCCL's own variables).
HANG_ADVICE = ("set NCCL_SOCKET_IFNAME to the interface the pods reach each other on (eth0 on most CNIs), "
               "NCCL_IB_DISABLE=1 when the nodes have no working RDMA between them, NCCL_P2P_DISABLE=1 if it still "
               "hangs, and NCCL_DEBUG=INFO to see where it stops — in the request's environment — and let the pods "
               "reach each other on MASTER_PORT and NCCL's ports (a NetworkPolicy); then submit again")

#: The program each rank runs (``python -c``): standard library and torch only, as any TAO image has.
PROBE_PROGRAM = r'''
import datetime, os, signal, sys, time

def say(*fields):
    print("TAO-COLLECTIVE", *(str(f).replace("\t", " ").replace("\n", " ")[:400] for f in fields), sep="\t",
          flush=True)

phase = "start"
timeout = float(os.environ.get("TAO_DATA_IO_PROBE_TIMEOUT") or 180)

def hung(signum, frame):
    say("hang", phase, f"no progress in {timeout:g}s")
    os._exit(124)

signal.signal(signal.SIGALRM, hung)
signal.alarm(max(1, round(timeout)))
try:
    import torch
    import torch.distributed as dist
    backend = os.environ.get("TAO_DATA_IO_PROBE_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["NODE_RANK"])
    phase = "rendezvous"
    started = time.monotonic()
    dist.init_process_group(backend, init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            world_size=world, rank=rank, timeout=datetime.timedelta(seconds=timeout))
    device = torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(0)
        device = torch.device("cuda", 0)
    phase = "all-reduce"
    value = torch.full((1 << 20,), float(rank + 1), device=device)  # 4 MiB, past NCCL's small-message path
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    if not bool(torch.all(value == expected)):
        say("wrong", phase, f"all-reduced {value[0].item():g}, expected {expected:g}")
        sys.exit(1)
    dist.destroy_process_group()
    say("ok", backend, world, f"{time.monotonic() - started:.2f}")
except Exception as exc:
    say("fail", phase, f"{type(exc).__name__}: {exc}")
    sys.exit(1)
'''


@dataclass(frozen=True)
class CollectiveVerdict:
    """What one rank's probe said: passed, or where and why it stopped, and what to do about it."""

    ok: bool
    #: "ok", "wrong", "fail" or "hang" (and "silent": the rank printed no verdict at all).
    outcome: str
    detail: str
    advice: str = ""

    def describe(self) -> str:
        return self.detail if self.ok else f"{self.detail}: {self.advice}"


def read_probe(output: str, exit_code: int, *, rank: int = 0) -> CollectiveVerdict:
    """One rank's verdict from its output and exit status (a log whose lines carry a prefix, such
    as the local frame's ``[rank N]``, reads the same)."""
    marker = LINE_PREFIX + "\t"
    lines = [line[line.index(marker):].split("\t") for line in output.splitlines() if marker in line]
    if not lines:
        how = "hung" if exit_code == HANG_EXIT else f"exited {exit_code}"
        return CollectiveVerdict(False, "silent", f"rank {rank}'s collective probe {how} without a verdict (is torch "
                                 "in the image?)", "read the rank's log")
    fields = lines[-1][1:] + ["", "", ""]
    outcome = fields[0]
    if outcome == "ok" and exit_code == 0:
        return CollectiveVerdict(True, "ok", f"{fields[2]} nodes all-reduced over {fields[1]} in {fields[3]}s")
    if outcome == "hang":
        return CollectiveVerdict(False, "hang", f"rank {rank} hung in the {fields[1]} ({fields[2]})", HANG_ADVICE)
    if outcome == "wrong":
        return CollectiveVerdict(False, "wrong", f"rank {rank}'s all-reduce gave a wrong sum ({fields[2]})",
                                 "the GPUs or their interconnect corrupt data: run the node's diagnostics "
                                 "(nvidia-smi, DCGM) before training there")
    return CollectiveVerdict(False, "fail", f"rank {rank}'s collective probe failed in the {fields[1]}: {fields[2]}",
                             HANG_ADVICE if fields[1] == "rendezvous" else "read the rank's log")
