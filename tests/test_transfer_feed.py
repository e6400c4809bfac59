"""A run's end ends all of it. The engine plans a chunk while the one before it moves (the
executor's workers take items from a feed, ``transfer/feed.py``); whatever stops the run — the
last batch, an interrupt, a callback that raises or exits — nothing of it is still moving once
it returns: no worker left on the loop, no file published into the destination after its lock
was released, no temp file left behind, and a run with nothing to move builds no data path."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tao_data_io.credentials import S3Credentials
from tao_data_io.embedded.s3 import EmbeddedS3
from tao_data_io.transfer import options as engine_module
from tao_data_io.transfer.engine import TransferEngine
from tao_data_io.transfer.options import TransferOptions
from tao_data_io.transfer import obstore_executor
from tao_data_io.transfer.obstore_executor import ObstoreExecutor
from tao_data_io.transfer.work import Item, ItemDone

from .helpers import temp_leftovers, tree_digest, write_tree

OBJECTS = 600


@pytest.fixture(scope="module")
def objects(s3_server: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A bucket of OBJECTS small objects under data/ (fewer than one listing page)."""
    source = tmp_path_factory.mktemp("objects")
    write_tree(source, {f"d{i % 6}/f{i:04d}.bin": f"object {i}\n".encode() * (1 + i % 5) for i in range(OBJECTS)})
    s3_server.create_bucket("review-pipeline")
    with TransferEngine(s3_server.credentials) as engine:
        assert engine.sync(str(source), "s3://review-pipeline/data/").ok
    return "review-pipeline"


def _live_tasks(executor: ObstoreExecutor) -> int:
    """How many tasks (the run's workers, its drain) are still alive on the executor's loop."""
    assert executor._loop is not None

    async def count() -> int:
        return len([task for task in asyncio.all_tasks() if task is not asyncio.current_task()])

    return asyncio.run_coroutine_threadsafe(count(), executor._loop.loop).result(timeout=30)


def _settled(executor: ObstoreExecutor, within: float = 5.0) -> int:
    """The live tasks once they stop (or ``within`` seconds have passed)."""
    deadline = time.monotonic() + within
    while (live := _live_tasks(executor)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return live


@contextmanager
def _interrupted(mover: ObstoreExecutor, bucket: str, dest: Path) -> Iterator[None]:
    """A sync through ``mover`` that ends in KeyboardInterrupt; the body runs with its engine open."""
    with TransferEngine(mover.credentials, executor=mover) as engine:
        with pytest.raises(KeyboardInterrupt):
            engine.sync(f"s3://{bucket}/data/", str(dest))
        yield


@pytest.fixture(params=["obstore", "s5cmd"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which executor moves the objects: obstore's workers on the loop, or the s5cmd child (as
    objects of 8 MiB and more go), each object checked once it lands. The same ends must hold."""
    if request.param == "s5cmd":
        monkeypatch.setattr(obstore_executor, "LARGE_OBJECT_BYTES", 1)


def test_an_interrupt_while_the_last_batch_moves_stops_it_before_the_run_returns(
        s3_credentials: S3Credentials, objects: str, tmp_path: Path) -> None:
    """Ctrl-C once every batch is handed over (the whole of any run under one listing page) is
    what an interrupt usually meets: the run must cancel what is in flight before the
    destination's lock is released, as it does for an interrupt met while planning."""
    returned = threading.Event()
    late: list[str] = []
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    class Interrupted(ObstoreExecutor):
        def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
            handed_all = threading.Event()
            interrupted: list[bool] = []

            def noted() -> Iterator[Sequence[Item]]:
                yield from batches
                handed_all.set()

            def done(item: Item, failed: Any, landed: Any) -> None:
                if not interrupted and handed_all.wait(timeout=30):
                    interrupted.append(True)
                    signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, on the thread that waits for the run
                time.sleep(0.005)  # the rest of the batch takes a while to finish
                if returned.is_set():
                    late.append(item.relative)
                on_done(item, failed, landed)

            super().run(noted(), done)

    dest = tmp_path / "d"
    mover = Interrupted(s3_credentials)
    with _interrupted(mover, objects, dest):
        returned.set()
        live = _settled(mover)
        arrived = len(tree_digest(dest))
    assert (live, len(late)) == (0, 0), (f"{live} tasks still on the loop and {len(late)} files finished after the "
                                         f"interrupted run returned ({arrived} of {OBJECTS} in the destination)")
    assert temp_leftovers(dest) == []


@pytest.mark.usefixtures("route")
def test_a_callback_that_raises_leaves_no_worker_moving_after_the_run_raised(
        s3_credentials: S3Credentials, objects: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A progress sink that fails once: the run ends with its error — and with it every worker,
    not only the one whose callback raised. The others must not go on publishing files into a
    destination whose lock is released, nor wait on the loop forever for a batch that never comes."""
    monkeypatch.setattr(engine_module, "PLAN_CHUNK", 100)
    monkeypatch.setattr(engine_module, "FIRST_CHUNK", 100)
    failed: list[bool] = []

    def fails_once(progress: Any) -> None:
        if progress.files_done and not failed:
            failed.append(True)
            raise RuntimeError("the progress sink hiccupped")

    dest = tmp_path / "d"
    with TransferEngine(s3_credentials) as engine:
        with pytest.raises(RuntimeError, match="hiccupped"):
            engine.sync(f"s3://{objects}/data/", str(dest), TransferOptions(progress=fails_once))
        at_return = set(tree_digest(dest))
        executor = engine.executor
        assert isinstance(executor, ObstoreExecutor)
        live = _settled(executor)
        later = set(tree_digest(dest))
        assert (live, len(later - at_return)) == (0, 0), (
            f"{live} tasks left on the loop; {len(later - at_return)} files published after the run raised")
        assert temp_leftovers(dest) == []
        assert engine.sync(f"s3://{objects}/data/", str(dest)).ok  # the same engine goes on


def test_an_interrupt_while_the_next_batch_is_planned_cancels_what_is_in_flight(
        s3_credentials: S3Credentials, objects: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or a Prefect cancel) while the second batch is planned: nothing more starts, what
    is in flight is cancelled, and no temp file is left (only whole files are published)."""
    monkeypatch.setattr(engine_module, "PLAN_CHUNK", 100)
    monkeypatch.setattr(engine_module, "FIRST_CHUNK", 100)

    class Interrupted(ObstoreExecutor):
        def run(self, batches: Iterable[Sequence[Item]], on_done: ItemDone) -> None:
            def cut() -> Iterator[Sequence[Item]]:
                yield next(iter(batches))
                raise KeyboardInterrupt

            super().run(cut(), on_done)

    dest = tmp_path / "d"
    mover = Interrupted(s3_credentials)
    with _interrupted(mover, objects, dest):
        assert _settled(mover, within=0) == 0
    assert len(tree_digest(dest)) <= 100 and temp_leftovers(dest) == []


@pytest.mark.usefixtures("route")
def test_a_callback_that_exits_ends_the_run_instead_of_hanging_it(
        s3_credentials: S3Credentials, objects: str, tmp_path: Path) -> None:
    """A callback that calls sys.exit (or raises KeyboardInterrupt) on the executor's loop thread
    stops that loop: the run must still end (with that exit, or an error), never wait forever —
    and so must one told of an object s5cmd delivered, whose check ran on that loop once."""
    def exits(progress: Any) -> None:
        if progress.files_done:
            raise SystemExit(3)

    engine = TransferEngine(s3_credentials)
    outcome: list[BaseException | None] = []

    def sync() -> None:
        try:
            engine.sync(f"s3://{objects}/data/", str(tmp_path / "d"), TransferOptions(progress=exits))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - whatever ends it
            outcome.append(exc)

    runner = threading.Thread(target=sync, daemon=True)
    runner.start()
    runner.join(timeout=60)
    hung = runner.is_alive()
    if not hung:
        engine.close()
    assert not hung, "the run still waits 60 s after its callback exited"
    assert isinstance(outcome[0], SystemExit) and temp_leftovers(tmp_path / "d") == []


def test_a_sync_with_nothing_to_move_builds_no_data_path(
        s3_credentials: S3Credentials, objects: str, tmp_path: Path) -> None:
    """The engine's promise (its module docstring): a sync that finds nothing to move never needs
    obstore or s5cmd — no executor, no event-loop thread."""
    dest = tmp_path / "d"
    with TransferEngine(s3_credentials) as engine:
        assert engine.sync(f"s3://{objects}/data/", str(dest)).transferred_files == OBJECTS
    with TransferEngine(s3_credentials) as engine:
        again = engine.sync(f"s3://{objects}/data/", str(dest))
        assert (again.transferred_files, again.unchanged_files) == (0, OBJECTS)
        assert "executor" not in engine.__dict__, "a run with nothing to move built the executor and its loop thread"
