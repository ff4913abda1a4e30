"""The outbox through the app: written with the step, delivered once per key, retried, dead."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock, cluster, settle


def make_app(delivered: list[tuple[str, str, Any]], failures: dict[str, int]) -> Any:
    def make(store: shoal.Store, clock: shoal.Clock, name: str) -> shoal.App:
        app = shoal.App("outbox", store=store, clock=clock, instance_id=name, lease=30.0)

        @app.workflow(name="order", max_attempts=3, backoff=1.0)
        async def order(ctx: shoal.RunContext, input: Any) -> str:
            async def confirm() -> str:
                ctx.outbox.send("email", {"to": input["email"], "order": input["id"]})
                ctx.outbox.send("audit", {"order": input["id"]})
                return "confirmed"

            await ctx.step("confirm", confirm)
            if ctx.attempt == 1 and input.get("fail_after_send"):
                raise RuntimeError("the next step failed")   # the run retries; no resend
            return "done"

        @app.outbox_handler("email", max_deliveries=3)
        async def email(payload: Any, key: str) -> None:
            left = failures.get(payload["order"], 0)
            if left:
                failures[payload["order"]] = left - 1
                raise ConnectionError("smtp down")
            delivered.append((name, key, payload))

        @app.outbox_handler("audit")
        def audit(payload: Any, key: str) -> None:      # a sync handler works too
            delivered.append((name, key, payload))

        return app

    return make


async def test_entries_are_delivered_once_even_when_the_run_retries() -> None:
    delivered: list[tuple[str, str, Any]] = []
    clock = VirtualClock()
    async with cluster(make_app(delivered, {}), instances=2, clock=clock) as (a, b):
        run = await a.dispatch("order", {"email": "x@y", "id": "o1", "fail_after_send": True})
        await until(lambda: _attempts(a, run.id, 2))
        await clock.advance(2)
        assert await b.result(run.id) == "done"
        await until(lambda: _count(delivered, 2))
        keys = sorted(k for _, k, _ in delivered)
        assert keys == [f"{run.id}:1:0", f"{run.id}:1:1"]
        await clock.advance(60)                              # nothing more is delivered
        assert len(delivered) == 2


async def _attempts(app: shoal.App, run_id: str, n: int) -> bool:
    return (await app.get_run(run_id)).attempts >= n


async def _count(items: list[Any], n: int) -> bool:
    return len(items) >= n


async def test_failed_deliveries_are_retried_then_dead_lettered() -> None:
    delivered: list[tuple[str, str, Any]] = []
    failures = {"flaky": 2, "dead": 99}
    clock = VirtualClock()
    async with cluster(make_app(delivered, failures), instances=1, clock=clock) as (a,):
        flaky = await a.dispatch("order", {"email": "f@y", "id": "flaky"})
        dead = await a.dispatch("order", {"email": "d@y", "id": "dead"})
        assert await a.result(flaky.id) == "done" and await a.result(dead.id) == "done"
        for _ in range(20):
            await clock.advance(10)
        emails = [p["order"] for _, _, p in delivered if "to" in p]
        assert emails == ["flaky"]                            # after two failures
        [letter] = await a.dead_letters()
        assert letter.payload["order"] == "dead" and letter.attempts == 3
        assert letter.error == "ConnectionError: smtp down"
        assert letter.key == f"{dead.id}:1:0"


async def test_redrive_in_another_namespace_changes_nothing() -> None:
    """An entry id given to another namespace's app is unknown there, and its entry stays
    dead (the store checked the namespace only after it had redriven the entry)."""
    delivered: list[tuple[str, str, Any]] = []
    clock = VirtualClock()
    store = MemoryStore()
    async with cluster(make_app(delivered, {"dead": 99}), instances=1, clock=clock,
                       store=store) as (a,):
        dead = await a.dispatch("order", {"email": "d@y", "id": "dead"})
        assert await a.result(dead.id) == "done"
        for _ in range(20):
            await clock.advance(10)
        [letter] = await a.dead_letters()
        other = shoal.App("elsewhere", store=store, clock=clock)
        with pytest.raises(shoal.UnknownOutboxEntryError, match="elsewhere"):
            await other.redrive(letter.id)
        [still] = await a.dead_letters()
        assert (still.id, still.dead, still.attempts) == (letter.id, True, 3)
        assert (await a.redrive(letter.id)).dead is False


async def test_send_outside_a_step_is_refused() -> None:
    app = shoal.App("outbox", store="memory://", clock=VirtualClock())

    @app.workflow(max_attempts=1)
    async def careless(ctx: shoal.RunContext, input: Any) -> None:
        ctx.outbox.send("email", {"to": "x"})

    async with app:
        run = await app.dispatch(careless)
        with pytest.raises(shoal.RunFailedError, match="outside a step"):
            await app.result(run.id)
    with pytest.raises(shoal.ConfigurationError, match="max_deliveries"):
        app.outbox_handler("email", max_deliveries=0)


async def test_a_step_retried_in_place_sends_only_its_last_tries_entries() -> None:
    delivered: list[tuple[str, Any]] = []
    clock = VirtualClock()
    app = shoal.App("outbox", store="memory://", clock=clock)
    tries: list[int] = []

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        delivered.append((key, payload))

    @app.workflow
    async def flow(ctx: shoal.RunContext, input: Any) -> None:
        async def send() -> None:
            tries.append(1)
            ctx.outbox.send("email", {"try": len(tries)})
            if len(tries) == 1:
                raise ConnectionError("flaky")

        await ctx.step.with_options(retries=1)("send", send)

    async with app:
        run = await app.dispatch(flow)
        await until(lambda: _count(tries, 1))
        await clock.advance(1)                      # the in-place retry's backoff
        await app.result(run.id)
        await until(lambda: _count(delivered, 1))
        await settle()
        assert delivered == [(f"{run.id}:1:0", {"try": 2})]


async def test_a_delivery_started_by_a_runs_step_works_for_no_run() -> None:
    """The step that writes entries starts a delivery pass at once; that pass, and the handlers
    it calls, run outside the run: a provider call in a handler charges no run's budget."""
    from shoal.backends.memory import MemoryStore
    from shoal.scope import current_run

    seen: list[object] = []
    app = shoal.App("outbox", store=MemoryStore(), clock=VirtualClock(), lease=30.0)

    @app.workflow
    async def order(ctx: shoal.RunContext, input: Any) -> None:
        async def confirm() -> None:
            ctx.outbox.send("email", {"order": 1})
            seen.append(current_run.get())   # inside the step: the run's own

        await ctx.step("confirm", confirm)

    @app.outbox_handler("email")
    async def email(payload: Any, key: str) -> None:
        seen.append(current_run.get())

    async with app:
        await app.dispatch(order, None)
        await until(lambda: _length_is(seen, 2))   # the first round of maintenance is over
        run = await app.dispatch(order, None)
        await until(lambda: _length_is(seen, 4))
    assert getattr(seen[2], "run_id", None) == run.id
    assert seen[1] is None and seen[3] is None


async def _length_is(items: list[object], n: int) -> bool:
    return len(items) == n
