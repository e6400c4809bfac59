"""What the local compute frame costs: the stand-in run bare, in a bare frame, and as a backend job.

    .venv/bin/python bench/frame.py [--reps 20]

Four numbers, medians over ``--reps`` repetitions, the contenders interleaved (the order rotates
every repetition, as in the other benchmarks):

* **bare** — ``sh examples/stand_in/train.sh -e SPEC`` with ``EPOCHS=1 EPOCH_SECONDS=0``, reading a
  small input, writing its results: the work itself;
* **frame** — the same command in the job's bubblewrap frame (:func:`frame_argv`, :func:`frame_env`:
  each source bound by descriptor, the seccomp filter, and — run as root — the job's user through
  setpriv), started and waited for directly: what the sandbox adds;
* **job** — ``LocalBackend.submit`` until ``status`` says COMPLETE: the supervisor, the verify
  probe in its own frame, the rank's frame and the records, as a user pays them;
* **submit→RUNNING** — ``submit`` until ``status`` says RUNNING, for a job that then waits for a
  file (and ``submit`` alone: how long the caller is held).

Status is polled every millisecond, so the job figures are exact to about that.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tao_data_io.launch.plan import LaunchPlan, PlanMount
from tao_data_io.backends.local.backend import LocalBackend
from tao_data_io.launch.binding import open_source
from tao_data_io.launch.run_as import run_as
from tao_data_io.launch.sandbox import Host, frame_argv, frame_binds, frame_env, host_system_dirs
from tao_data_io.launch.seccomp import filter_fd
from tao_data_io.backends.local.settings import LocalSettings
from tao_data_io.launch.tools import BWRAP_INSTALL, find_tool
from tao_data_io.records import OutputRoute

STAND_IN = Path(__file__).resolve().parents[1] / "examples" / "stand_in"
_POLL_S = 0.001


def make_plan(stage: Path, job_id: str, **env: str) -> LaunchPlan:
    return LaunchPlan(
        job_id=job_id, image="host", argv=["sh", "/stand-in/train.sh", "-e", "/config/spec.yaml"],
        env={"EPOCHS": "1", "EPOCH_SECONDS": "0", "TRAIN_INPUTS": "/data", "TAO_JOB_ID": job_id,
             "TAO_RESULTS_DIR": "/results", **env},
        mounts=[PlanMount(origin="staged", source="data", target="/data", expect="dir", input="s3://bench/data/"),
                PlanMount(origin="config", source="spec.yaml", target="/config/spec.yaml", expect="file",
                          input="config"),
                PlanMount(origin="pre-positioned", source=str(STAND_IN), target="/stand-in", input=str(STAND_IN))],
        staging_dir=str(stage), results_dir="/results", config_path="/config/spec.yaml",
        route=OutputRoute(route="ephemeral", destination="container-local"), tier="B", gpus=0, nodes=1,
        shm_size="64Mi")


def until(predicate: Callable[[], bool]) -> None:
    while not predicate():
        time.sleep(_POLL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-frame-") as tmp:
        root = Path(tmp)
        stage = root / "stage"
        (stage / "data").mkdir(parents=True)
        for index in range(10):
            (stage / "data" / f"part-{index}.bin").write_bytes(os.urandom(64 * 1024))
        (stage / "spec.yaml").write_text("train:\n  epochs: 1\n")
        backend = LocalBackend(LocalSettings(run_root=str(root / "local")))
        host = Host(bwrap=find_tool("bwrap", BWRAP_INSTALL), system=host_system_dirs(), run_as=run_as(None, None))
        counter = iter(range(10**6))

        def bare() -> float:
            results = root / f"bare-{next(counter)}"
            results.mkdir()
            env = {"PATH": os.environ["PATH"], "EPOCHS": "1", "EPOCH_SECONDS": "0", "TRAIN_INPUTS": str(stage / "data"),
                   "TAO_RESULTS_DIR": str(results)}
            start = time.perf_counter()
            subprocess.run(["sh", str(STAND_IN / "train.sh"), "-e", str(stage / "spec.yaml")], env=env, check=True,
                           stdout=subprocess.DEVNULL)
            return time.perf_counter() - start

        def frame() -> float:
            plan = make_plan(stage, f"frame-{next(counter)}")
            results = root / plan.job_id
            results.mkdir()
            if host.run_as is not None:
                os.chown(results, host.run_as.uid, host.run_as.gid)
            binds = frame_binds(plan, str(results))
            start = time.perf_counter()  # the descriptors and the filter are the frame's cost too
            opened = {bind.target: fd for bind in binds if (fd := open_source(bind.source)) is not None}
            seccomp = filter_fd()
            try:
                argv = frame_argv(plan, host, binds, opened, plan.argv, seccomp_fd=seccomp)
                subprocess.run(argv, env=frame_env(plan), check=True, stdout=subprocess.DEVNULL,
                               pass_fds=(*opened.values(), seccomp))
            finally:
                for fd in (*opened.values(), seccomp):
                    os.close(fd)
            return time.perf_counter() - start

        def job() -> float:
            plan = make_plan(stage, f"job-{next(counter)}")
            start = time.perf_counter()
            ref = backend.submit(plan).backend_ref
            until(lambda: backend.status(ref).terminal)
            elapsed = time.perf_counter() - start
            assert backend.status(ref).state == "COMPLETE", backend.status(ref)
            return elapsed

        submit_only: list[float] = []

        def running() -> float:
            hold = root / f"hold-{next(counter)}"
            plan = make_plan(stage, f"run-{next(counter)}", HOLD_FILE="/hold/go")
            plan = plan.model_copy(update={"mounts": [*plan.mounts, PlanMount(
                origin="pre-positioned", source=str(hold), target="/hold", input=str(hold))]})
            hold.mkdir()
            (hold / "waiting").touch()  # verify refuses an empty input directory
            start = time.perf_counter()
            ref = backend.submit(plan).backend_ref
            submit_only.append(time.perf_counter() - start)
            until(lambda: backend.status(ref).state == "RUNNING" or backend.status(ref).terminal)
            elapsed = time.perf_counter() - start
            assert backend.status(ref).state == "RUNNING", backend.status(ref)
            (hold / "go").touch()
            until(lambda: backend.status(ref).terminal)
            return elapsed

        contenders: dict[str, Callable[[], float]] = {"bare": bare, "frame": frame, "job": job,
                                                       "submit→RUNNING": running}
        times: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for rep in range(args.reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                times[name].append(contenders[name]())
        times["submit() alone"] = submit_only
        medians = {name: statistics.median(values) for name, values in times.items()}
        print(f"wall ms over {args.reps} runs: median (min, quartiles) — the spread shows how loaded the host was")
        for name, values in times.items():
            low, high = statistics.quantiles(values, n=4)[0::2]
            print(f"  {name:<15} {medians[name] * 1000:7.1f}  ({min(values) * 1000:.1f}, "
                  f"{low * 1000:.1f}–{high * 1000:.1f})")
        for name in ("frame", "job"):
            print(f"{name} vs bare: {(medians[name] - medians['bare']) * 1000:+.1f} ms "
                  f"({medians[name] / medians['bare']:.2f}×)")


if __name__ == "__main__":
    main()
