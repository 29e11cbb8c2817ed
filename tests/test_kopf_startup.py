"""kopf's start-up barrier with `kopf_startup.install()`: released exactly when every toggle is
gone or on, with wake-ups linear in the objects (tritonscale.drivers.kopf_startup)."""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.aiokits import aiotoggles

from tritonscale.drivers import kopf_startup

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def installed() -> None:
    assert kopf_startup.install(), "kopf's ToggleSet is not what kopf_startup was written for"


async def settle() -> None:
    """Let every task that is ready run (the loop's turns, not time)."""
    for _ in range(10):
        await asyncio.sleep(0)


class CountingSet(aiotoggles.ToggleSet):
    """A ToggleSet that counts how often its state is asked (each waiter's wake-up asks)."""

    asked = 0

    def is_on(self) -> bool:
        CountingSet.asked += 1
        return super().is_on()


async def test_the_barrier_opens_when_the_last_objects_toggle_is_dropped_and_not_before() -> None:
    barrier = aiotoggles.ToggleSet(all)
    toggles = [await barrier.make_toggle(name=f"object {i}") for i in range(3)]
    waiter = asyncio.ensure_future(barrier.wait_for(True))
    for toggle in toggles[:2]:
        await barrier.drop_toggle(toggle)
    await settle()
    assert not waiter.done(), "released while one object was not indexed yet"
    await barrier.drop_toggle(toggles[2])
    await asyncio.wait_for(waiter, timeout=5)


async def test_a_toggle_made_closes_an_open_barrier_for_those_waiting_on_it_closing() -> None:
    barrier = aiotoggles.ToggleSet(all)
    waiter = asyncio.ensure_future(barrier.wait_for(False))
    await settle()
    assert not waiter.done()  # an empty set is all on
    await barrier.make_toggle(name="object")
    await asyncio.wait_for(waiter, timeout=5)


async def test_a_member_turned_on_still_wakes_the_waiters_of_an_any_set() -> None:
    # Peering's pause is an any-set whose members are turned on and off, not dropped.
    paused = aiotoggles.ToggleSet(any)
    member = await paused.make_toggle(False, name="peer")
    waiter = asyncio.ensure_future(paused.wait_for(True))
    await settle()
    assert not waiter.done()
    await member.turn_to(True)
    await asyncio.wait_for(waiter, timeout=5)


async def test_objects_indexed_one_by_one_wake_the_waiters_once_not_once_per_object() -> None:
    # As kopf's queueing does: each listed object gets a toggle and a worker that drops it
    # and waits for all. kopf alone asks the state about n²/2 times (every waiter at every
    # toggle); here each waiter asks a few times.
    objects = 400
    barrier = CountingSet(all)
    listing = await barrier.make_toggle(name="listing")

    async def worker(toggle: aiotoggles.Toggle) -> None:
        await asyncio.sleep(0)
        await barrier.drop_toggle(toggle)
        await barrier.wait_for(True)

    CountingSet.asked = 0
    workers = []
    for i in range(objects):
        toggle = await barrier.make_toggle(name=f"object {i}")
        workers.append(asyncio.ensure_future(worker(toggle)))
        await asyncio.sleep(0)
    await barrier.drop_toggle(listing)
    await asyncio.wait_for(asyncio.gather(*workers), timeout=30)
    assert CountingSet.asked < 10 * objects, CountingSet.asked
