"""The executor's memory budget (:mod:`tao_data_io.transfer.memory_budget`): what fits is taken at once,
what does not waits its turn in order, and a worker cancelled while it waits (an interrupt, a
failed run) neither keeps bytes nor holds up those behind it."""

from __future__ import annotations

import asyncio

from tao_data_io.transfer.memory_budget import MemoryBudget


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


def test_what_fits_is_taken_without_waiting_and_given_back() -> None:
    async def run() -> None:
        budget = MemoryBudget(100)
        assert await budget.reserve(60) == 60 and await budget.reserve(40) == 40
        assert budget.free == 0
        budget.release(60)
        budget.release(40)
        assert budget.free == 100

    asyncio.run(run())


def test_a_reservation_larger_than_the_budget_takes_the_whole_budget_once_all_is_free() -> None:
    async def run() -> None:
        budget = MemoryBudget(100)
        small = await budget.reserve(10)
        whole = asyncio.ensure_future(budget.reserve(500))
        await _settle()
        assert not whole.done()
        budget.release(small)
        assert await whole == 100 and budget.free == 0

    asyncio.run(run())


def test_waiters_are_granted_in_the_order_they_asked_so_a_large_one_is_not_passed_by_small_ones() -> None:
    async def run() -> None:
        budget = MemoryBudget(100)
        held = await budget.reserve(90)
        order: list[str] = []

        async def ask(name: str, amount: int) -> int:
            taken = await budget.reserve(amount)
            order.append(name)
            return taken

        large = asyncio.ensure_future(ask("large", 50))
        await _settle()
        small = asyncio.ensure_future(ask("small", 5))  # fits in the 10 left, yet waits behind
        await _settle()
        assert order == [] and budget.free == 10
        budget.release(held)
        await asyncio.gather(large, small)
        assert order == ["large", "small"] and budget.free == 45

    asyncio.run(run())


def test_a_worker_cancelled_while_it_waits_keeps_nothing_and_holds_no_one_up() -> None:
    async def run() -> None:
        budget = MemoryBudget(100)
        held = await budget.reserve(80)
        first = asyncio.ensure_future(budget.reserve(50))  # first in line, cannot fit
        await _settle()
        second = asyncio.ensure_future(budget.reserve(20))  # would fit, but waits behind it
        await _settle()
        assert not second.done()
        first.cancel()
        await _settle()
        assert first.cancelled() and await asyncio.wait_for(second, timeout=5) == 20
        budget.release(held)
        budget.release(20)
        assert budget.free == 100

    asyncio.run(run())


def test_a_worker_cancelled_as_it_is_granted_gives_the_bytes_back() -> None:
    async def run() -> None:
        budget = MemoryBudget(100)
        held = await budget.reserve(100)
        waiting = asyncio.ensure_future(budget.reserve(30))
        await _settle()
        budget.release(held)  # grants the waiter: its future is done, the task not yet resumed
        waiting.cancel()
        await _settle()
        assert waiting.cancelled() and budget.free == 100

    asyncio.run(run())
