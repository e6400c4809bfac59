"""The feed between a planning thread and an event loop's workers: batches in, items out.

Why: a run of 1.28 M objects is planned a chunk at a time on the caller's thread while the
workers of the executor's event loop move the chunk before it. Planning and moving overlap (a
gap between chunks would idle every worker), memory holds three batches whatever the run's
length (the one moving, one waiting here, the one being planned), and whatever ends the run —
the last batch, an error while planning, a callback that raises, an interrupt — nothing of it is
still moving once the caller's :meth:`Feed.run` has returned or raised.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Feed(Generic[T]):
    """Items for ``workers`` coroutines on ``loop``, from batches the calling thread hands over.
    Its coroutines run on the loop only; :meth:`run` is what the calling thread calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[T] = deque()
        self._batches: asyncio.Queue[Sequence[T] | None] = asyncio.Queue(maxsize=1)
        self._refill = asyncio.Lock()
        self._ended = False
        self._workers: list[asyncio.Task[None]] = []
        self._failure: BaseException | None = None

    # ------------------------------------------------------------------ the calling thread
    def run(self, batches: Iterable[Sequence[T]], workers: list[Coroutine[Any, Any, None]]) -> None:
        """Start ``workers`` on the loop, hand each batch to them as they have room (the next
        batch is read once this one is handed over), and return once every item handed over is
        done. An error while reading the batches is raised once the items handed over before it
        are done (they are kept); a worker's callback that raises ends the run with that error; an
        interrupt cancels what is in flight. Either way no worker is left running."""
        drained = asyncio.run_coroutine_threadsafe(self._work(workers), self._loop)
        try:
            planning: Exception | None = None
            try:
                for batch in batches:
                    if batch:
                        self._hand(batch, drained)
            except Exception as exc:  # noqa: BLE001 - raised below, once what was handed over is done
                planning = exc
            if not drained.done():
                self._hand(None, drained)
            drained.result()
            if self._failure is not None:
                raise self._failure
            if planning is not None:
                raise planning
        except BaseException:
            asyncio.run_coroutine_threadsafe(self._abort(), self._loop).result()
            raise

    def _hand(self, batch: Sequence[T] | None, drained: Future[None]) -> None:
        """Wait until the feed takes ``batch`` (None: the end) — or, if the workers stopped first
        (a callback failed), raise their error instead of waiting for room that never comes."""
        handed = asyncio.run_coroutine_threadsafe(self._batches.put(batch), self._loop)
        wait([handed, drained], return_when=FIRST_COMPLETED)
        if not handed.done():
            handed.cancel()
            drained.result()
            raise self._failure or RuntimeError("the transfer workers stopped before the run was handed over")
        handed.result()

    # ------------------------------------------------------------------ the loop
    async def take(self) -> T | None:
        """The next item, waiting for the next batch when this one is taken; None once ended."""
        while not self._items:
            if self._ended:
                return None
            async with self._refill:  # one worker waits for the next batch; the rest wait for it
                if self._items or self._ended:
                    continue
                batch = await self._batches.get()
                if batch is None:
                    self._ended = True
                else:
                    self._items.extend(batch)
        return self._items.popleft()

    def fail(self, error: BaseException) -> None:
        """A worker's callback raised ``error``: it ends the run (raised on the calling thread,
        never on the loop, which would stop it) and every other worker is cancelled."""
        if self._failure is None:
            self._failure = error
        self._stop(but=asyncio.current_task())

    async def _work(self, workers: list[Coroutine[Any, Any, None]]) -> None:
        self._workers = [asyncio.ensure_future(worker) for worker in workers]
        for outcome in await asyncio.gather(*self._workers, return_exceptions=True):
            if isinstance(outcome, Exception) and self._failure is None:
                self._failure = outcome  # a worker's own bug: the run's error too

    async def _abort(self) -> None:
        """End the feed now and return once each worker has finished cancelling (a download
        removes its temp file then, before the caller closes the directories it writes in)."""
        self._stop(but=None)
        await asyncio.gather(*self._workers, return_exceptions=True)

    def _stop(self, but: asyncio.Task[Any] | None) -> None:
        self._ended = True
        self._items.clear()
        while not self._batches.empty():  # a put waiting for room completes; its batch never starts
            self._batches.get_nowait()
        for worker in self._workers:
            if worker is not but:
                worker.cancel()
