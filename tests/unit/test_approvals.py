"""Approvals across instances: ctx.approval, pending_pauses, resume, expiry, notifications."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.testing import VirtualClock, cluster, settle


async def _pending(app: shoal.App) -> bool:
    return bool(await app.pending_pauses())


def make(store: shoal.Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
    app = shoal.App("approvals", store=store, clock=clock, instance_id=instance_id, lease=30.0,
                    max_concurrent_runs=1, pause_retention=3600.0)

    @app.workflow(name="refund", concurrency_key=lambda i: i["customer"])
    async def refund(ctx: shoal.RunContext, input: Any) -> Any:
        quote = await ctx.step("quote", lambda: {"amount": input["amount"]})
        decision = await ctx.approval("refund", quote, expires_in=600)
        if not decision.approved:
            return {"refunded": False, "reason": decision.reason, "by": decision.by}
        await ctx.step("pay", lambda: "paid")
        return {"refunded": True, "by": decision.by, "data": decision.data, "on": instance_id}

    @app.workflow(name="other")
    async def other(ctx: shoal.RunContext, input: Any) -> str:
        return "ran"

    return app


async def test_a_pause_made_on_one_instance_is_resumed_on_the_other() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=2, clock=clock) as (a, b):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        [pause] = await b.pending_pauses()
        assert pause.run_id == run.id and pause.name == "refund"
        assert pause.request == {"amount": 40}
        assert pause.expires_at == pause.created_at + 600
        # the waiting run holds no slot (max_concurrent_runs=1) and keeps its key
        quick = await a.dispatch("other")
        assert await a.result(quick.id) == "ran"
        same_key = await a.dispatch("refund", {"customer": "c1", "amount": 5})
        await settle()
        assert (await a.get_run(same_key.id)).status == "queued"
        resolved = await b.resume(pause.id, approved=True, data={"note": "fine"}, by="ana")
        assert resolved.status == "resolved"
        out = await b.result(run.id)
        assert out["refunded"] is True and out["by"] == "ana" and out["data"] == {"note": "fine"}
        await until(lambda: _pending(b))               # now the second run asks
        assert (await a.get_run(run.id)).attempts == 1


async def test_two_resumes_at_once_exactly_one_wins() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=2, clock=clock) as (a, b):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        [pause] = await a.pending_pauses()
        results = await asyncio.gather(a.resume(pause.id, approved=True, by="ana"),
                                       b.resume(pause.id, approved=False, by="bo"),
                                       return_exceptions=True)
        wins = [r for r in results if isinstance(r, shoal.Pause)]
        losses = [r for r in results if isinstance(r, shoal.NotPausedError)]
        assert len(wins) == 1 and len(losses) == 1
        assert "already resolved" in str(losses[0])
        out = await a.result(run.id)
        assert out["by"] == wins[0].decision["by"]


async def test_an_approval_expires_when_the_clock_passes_it() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=2, clock=clock) as (a, b):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        [pause] = await a.pending_pauses()
        await clock.advance(599)
        assert (await a.get_run(run.id)).status == "waiting"
        await clock.advance(11)                          # past expiry, and a poll
        assert await b.result(run.id) == {"refunded": False, "reason": "expired", "by": None}
        with pytest.raises(shoal.NotPausedError, match="expired"):
            await a.resume(pause.id)
        await clock.advance(3600)                        # past pause_retention
        with pytest.raises(shoal.UnknownPauseError):
            await a.resume(pause.id)


async def test_a_notification_whose_sender_raised_is_sent_again() -> None:
    clock = VirtualClock()
    calls: list[tuple[str, str]] = []

    def make_notifying(store: shoal.Store, clk: shoal.Clock, name: str) -> shoal.App:
        app = make(store, clk, name)

        @app.on_pause_notify
        async def notify(pause: shoal.Pause) -> None:
            calls.append((name, pause.id))
            if len(calls) == 1:
                raise ConnectionError("mail server down")

        return app

    async with cluster(make_notifying, instances=2, clock=clock) as (a, _b):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        await settle()
        [pause] = await a.pending_pauses()
        assert calls == [("instance-0", pause.id)]      # sent at once, and it failed
        await clock.advance(10)                           # a poll, within the sender's lease
        assert len(calls) == 1
        await clock.advance(30)                           # the lease passed: sent again, once
        assert len(calls) == 2 and calls[1][1] == pause.id
        await clock.advance(120)
        assert len(calls) == 2


async def test_bad_resumes_change_nothing() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=1, clock=clock) as (a,):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        [pause] = await a.pending_pauses()
        with pytest.raises(shoal.UnknownPauseError, match="no-such"):
            await a.resume("no-such-pause")
        with pytest.raises(TypeError, match=r"data\['when'\] is a object"):
            await a.resume(pause.id, data={"when": object()})
        with pytest.raises(TypeError, match="approved must be True or False"):
            await a.resume(pause.id, approved="yes")  # type: ignore[arg-type]
        assert [p.id for p in await a.pending_pauses()] == [pause.id]
        assert (await a.get_run(run.id)).status == "waiting"


async def test_cancelling_a_waiting_run_resolves_its_pause() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=1, clock=clock) as (a,):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        [pause] = await a.pending_pauses()
        await a.cancel(run.id)
        assert await a.pending_pauses() == []
        with pytest.raises(shoal.NotPausedError, match="cancelled"):
            await a.resume(pause.id)


async def test_another_namespace_cannot_answer_or_cancel() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=1, clock=clock) as (a,):
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        [pause] = await a.pending_pauses()
        other = shoal.App("elsewhere", store=a.store, clock=clock)
        async with other.open():
            with pytest.raises(shoal.UnknownPauseError):
                await other.resume(pause.id)
            with pytest.raises(shoal.UnknownRunError):
                await other.cancel(run.id)
        assert [p.id for p in await a.pending_pauses()] == [pause.id]
        assert (await a.get_run(run.id)).status == "waiting"



class _Pauses:
    """An observer counting, per instance, the times a run parked."""

    def __init__(self) -> None:
        self.count = 0

    def on_run_pause(self, run: shoal.Run) -> None:
        self.count += 1


async def test_a_stray_signal_named_after_the_pause_parks_the_run_again() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=2, clock=clock) as (a, b):
        parks = [a.observe(_Pauses()), b.observe(_Pauses())]
        run = await a.dispatch("refund", {"customer": "c1", "amount": 40})
        await until(status_is(a, run.id, "waiting"))
        assert sum(p.count for p in parks) == 1
        [pause] = await a.pending_pauses()
        # delivers the run while its pause is pending: it must park again, not go on
        await b.signal(run.id, f"shoal.pause:{pause.id}", None)

        async def parked_twice() -> bool:
            return sum(p.count for p in parks) == 2

        await until(parked_twice)
        assert (await a.get_run(run.id)).status == "waiting"
        assert [p.id for p in await b.pending_pauses()] == [pause.id]
        await b.resume(pause.id, approved=True, by="ana")
        out = await a.result(run.id)
        assert out["refunded"] is True and out["by"] == "ana"
        assert (await a.get_run(run.id)).attempts == 1
