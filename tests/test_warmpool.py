"""The one warm pool (containers and kernels use it): fill, take, failure without a retry loop, idle expiry, close."""

from __future__ import annotations

import asyncio
import itertools

from execspace.process.warmpool import WarmPool


class Maker:
    def __init__(self, fail_from: int | None = None) -> None:
        self.count = itertools.count(1)
        self.fail_from = fail_from
        self.made = 0
        self.discarded: list[int] = []

    async def make(self) -> int:
        n = next(self.count)
        await asyncio.sleep(0)
        if self.fail_from is not None and n >= self.fail_from:
            raise RuntimeError(f"make {n} failed")
        self.made += 1
        return n

    async def discard(self, item: int) -> None:
        self.discarded.append(item)


async def test_fills_hands_each_item_out_once_and_refills() -> None:
    m = Maker()
    pool = WarmPool(2, m.make, m.discard, starts_at_once=2)
    assert not await asyncio.wait_for(pool.ready(), 1)  # nothing asked for yet: nothing in flight to wait for
    pool.refill()
    assert await pool.ready(5) and sorted(pool.idle()) == [1, 2]
    first = pool.take()
    assert first is not None and first not in pool.idle()
    pool.refill()
    assert await pool.ready(5) and pool.available() == 2 and first not in pool.idle()
    left = pool.idle()
    await pool.close()
    assert sorted(m.discarded) == sorted(left) and pool.available() == 0 and first not in m.discarded


async def test_a_failed_make_is_remembered_and_not_retried_until_the_next_refill() -> None:
    m = Maker(fail_from=2)
    pool = WarmPool(3, m.make, m.discard)
    pool.refill()
    assert not await pool.ready(5)
    assert isinstance(pool.last_error, RuntimeError) and pool.idle() == [1]
    await asyncio.sleep(0.05)
    assert m.made == 1 and next(m.count) == 3  # exactly one failed attempt: no hot loop
    await pool.close()
    assert m.discarded == [1]


async def test_idle_items_expire_and_close_discards_the_rest() -> None:
    m = Maker()
    pool = WarmPool(1, m.make, m.discard, idle_timeout=0.05)
    pool.refill()
    assert await pool.ready(5)
    for _ in range(200):
        if m.discarded:
            break
        await asyncio.sleep(0.01)
    assert m.discarded == [1] and pool.available() == 0
    pool.refill()
    assert await pool.ready(5) and pool.idle() == [2]
    await pool.close()
    pool.refill()  # closed: stays empty
    assert pool.available() == 0 and 2 in m.discarded


async def test_given_back_items_are_handed_out_first() -> None:
    m = Maker()
    pool = WarmPool(2, m.make, m.discard)
    pool.refill()
    assert await pool.ready(5)
    a = pool.take()
    assert a is not None
    pool.give_back(a)
    assert pool.take() == a
    await pool.close()
