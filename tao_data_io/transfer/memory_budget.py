"""The bytes an executor's workers may hold in memory at once.

Why: each worker holds what it moves — a file read whole for one PUT, the parts of a multipart
upload in flight, a body read whole or a chunk of one — and an executor runs many workers (64
and up) so that small objects overlap their round trips. Unbounded, a tree of large files was
held whole: twelve files of 40 MiB grew an upload by 490 MiB (``tests/test_transfer_memory.py``).
So a worker reserves what it will hold before it holds it, and waits while the budget is spent.

Reservations are granted in the order they were asked for: a multipart upload waiting for its
share is not passed for ever by small files that each fit in what is left. A reservation larger
than the whole budget is cut to the budget (it then waits for everything else to finish).

The budget lives on one event loop (the executor's): it is not thread-safe, and need not be.
"""

from __future__ import annotations

import asyncio
from collections import deque


class MemoryBudget:
    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiting: deque[tuple[int, asyncio.Future[None]]] = deque()

    async def reserve(self, amount: int) -> int:
        """Wait until ``amount`` bytes (at most the whole budget) are free, take them and return
        how many were taken: what :meth:`release` is given back once they are no longer held."""
        amount = min(amount, self.total)
        if not self._waiting and amount <= self.free:  # the common case: no wait, no future
            self.free -= amount
            return amount
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((amount, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(amount)  # granted as the cancellation came: give it back
            else:
                if (amount, granted) in self._waiting:  # _grant drops one cancelled first
                    self._waiting.remove((amount, granted))
                self._grant()  # it may have been first in line, holding the others up
            raise
        return amount

    def release(self, amount: int) -> None:
        """Give back what :meth:`reserve` returned, and grant those waiting, in order, what now fits."""
        self.free += amount
        self._grant()

    def _grant(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            amount, granted = self._waiting.popleft()
            if not granted.done():  # cancelled while it waited: nothing taken
                self.free -= amount
                granted.set_result(None)
