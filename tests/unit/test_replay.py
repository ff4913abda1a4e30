"""Replay before deploy: ``shoal.testing.replay(app, history)`` runs workflow code over a recorded
history without a store and without running a step. Recorded steps, sleeps, signal waits,
approvals and children give their recorded outcomes; the replay stops where the history ends
and reports the first checkpoint where the code leaves the recorded path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest

import shoal
from shoal.app.history import export
from shoal.engine.replay import History, HistoryFormatError
from shoal.testing import VirtualClock, replay


class Order(pydantic.BaseModel):
    customer: str
    amount: int


calls: list[str] = []


async def charge(order: Order) -> Order:
    calls.append("charge")
    return order


def ship(order: Order) -> str:            # a plain function: a thread
    calls.append("ship")
    return f"shipped {order.customer}"


class OrderV2(pydantic.BaseModel):
    customer: str
    amount: int
    currency: str                                   # new and required


async def charge_v2(order: OrderV2) -> OrderV2:
    return order


def register_v1(app: shoal.App) -> None:
    @app.workflow(name="flow")
    async def flow(ctx: shoal.RunContext, order: Order) -> dict[str, Any]:
        charged = await ctx.step("charge", charge, order)
        await ctx.sleep(60)
        paid = await ctx.wait_for("paid", timeout=600)
        decision = await ctx.approval("ship", {"amount": charged.amount})
        child = await ctx.start_child(child_wf, charged)
        label = await child.result()
        shipped = await ctx.step("ship", ship, charged) if decision.approved else None
        return {"paid": paid, "label": label, "shipped": shipped}

    @app.workflow(name="child_wf")
    async def child_wf(ctx: shoal.RunContext, order: Order) -> str:
        return f"label for {order.customer}"


async def recorded_history(until: str) -> dict[str, Any]:
    """A run of v1's ``flow`` driven to ``until`` ("sleeping", "waiting", "done"), exported."""
    clock = VirtualClock()
    app = shoal.App("shop", store="memory://", clock=clock)
    register_v1(app)
    async with app:
        run = await app.dispatch("flow", {"customer": "c1", "amount": 5})
        await clock.advance(1)
        if until != "sleeping":
            await clock.advance(60)
            await app.signal(run.id, "paid", {"by": "card"})
            await clock.advance(1)
        if until == "done":
            [pause] = await app.pending_pauses()
            await app.resume(pause.id, approved=True, by="ops")
            for _ in range(5):
                await clock.advance(1)
            assert (await app.get_run(run.id)).status == "succeeded"
        return await export(app, run.id)


async def test_the_same_code_replays_every_history_without_running_a_step() -> None:
    for until, outcome, replayed in [("sleeping", "ended", 1), ("waiting", "ended", 3),
                                     ("done", "returned", 7)]:
        history = await recorded_history(until)
        calls.clear()
        app = shoal.App("shop", store="memory://")       # never opened: no store call
        register_v1(app)
        result = await replay(app, history)
        assert (result.ok, result.outcome, result.replayed) == (True, outcome, replayed), result
        assert result.steps == len(history["steps"]) and result.mismatch is None
        assert calls == []                               # no step function ran


async def test_a_changed_path_is_reported_at_its_first_checkpoint() -> None:
    history = await recorded_history("done")
    app = shoal.App("shop", store="memory://")

    @app.workflow(name="flow")
    async def flow(ctx: shoal.RunContext, order: Order) -> None:
        await ctx.step("charge", charge, order)
        await ctx.step("fraud_check", ship, order)       # new: where the sleep was recorded
        await ctx.sleep(60)

    result = await replay(app, history)
    assert not result.ok and result.outcome == "mismatch"
    assert result.mismatch is not None
    assert (result.mismatch.seq, result.mismatch.recorded, result.mismatch.new) == (
        2, "shoal.sleep", "fraud_check")
    assert result.replayed == 1
    assert "nondeterministic at #2: recorded 'shoal.sleep', the code reached 'fraud_check'" \
        in str(result)
    assert result.to_json()["mismatch"] == {"seq": 2, "recorded": "shoal.sleep",
                                            "new": "fraud_check", "detail": None}


async def test_code_that_returns_before_the_history_ends_is_a_mismatch() -> None:
    history = await recorded_history("done")
    app = shoal.App("shop", store="memory://")

    @app.workflow(name="flow")
    async def flow(ctx: shoal.RunContext, order: Order) -> None:
        await ctx.step("charge", charge, order)

    result = await replay(app, history)
    assert not result.ok and result.mismatch is not None
    assert (result.mismatch.seq, result.mismatch.recorded, result.mismatch.new) == (
        2, "shoal.sleep", None)


async def test_a_model_that_no_longer_loads_the_recorded_json_fails_the_replay() -> None:
    history = await recorded_history("sleeping")
    app = shoal.App("shop", store="memory://")

    @app.workflow(name="flow")
    async def flow(ctx: shoal.RunContext, order: dict[str, Any]) -> None:
        await ctx.step("charge", charge_v2, OrderV2(currency="eur", **order))
        await ctx.sleep(60)

    result = await replay(app, history)
    assert not result.ok and result.outcome == "raised"
    assert result.error is not None and "currency: Field required" in result.error


async def test_a_failed_run_that_raises_again_replays() -> None:
    clock = VirtualClock()
    app = shoal.App("shop", store="memory://", clock=clock)

    @app.workflow(name="strict", max_attempts=1)
    async def strict(ctx: shoal.RunContext, input: int) -> int:
        n = await ctx.step("double", lambda: input * 2)
        if n > 5:
            raise ValueError("too big")
        return n

    async with app:
        run = await app.dispatch("strict", 3)
        await clock.advance(1)
        history = await export(app, run.id)
    assert history["run"]["status"] == "failed"
    result = await replay(app, history)
    assert result.ok and result.outcome == "raised" and result.error == "ValueError: too big"


async def test_histories_are_read_from_files_and_checked(tmp_path: Path) -> None:
    history = await recorded_history("sleeping")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(history))
    app = shoal.App("shop", store="memory://")
    register_v1(app)
    assert (await replay(app, path)).ok
    assert (await replay(app, str(path))).ok
    assert History.from_json(history).to_json() == history
    with pytest.raises(HistoryFormatError, match="not a shoal run history"):
        await replay(app, {"run": {}})
    with pytest.raises(HistoryFormatError, match="history version 2: this shoal reads "
                                                 "version 1"):
        await replay(app, {**history, "version": 2})
    with pytest.raises(HistoryFormatError, match="cannot read the history"):
        await replay(app, tmp_path / "missing.json")
    other = shoal.App("shop", store="memory://")
    with pytest.raises(shoal.UnknownWorkflowError, match="'flow'"):
        await replay(other, history)


async def test_a_replay_drops_progress_reports_and_writes_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    def register(app: shoal.App) -> None:
        @app.workflow(name="flow")
        async def flow(ctx: shoal.RunContext, _: Any) -> int:
            ctx.progress(0.1, "start")
            n = await ctx.step("one", lambda: 1)
            ctx.progress(0.9, "end")
            return int(n)

    clock = VirtualClock()
    app = shoal.App("shop", store="memory://", clock=clock)
    register(app)
    async with app:
        run = await app.dispatch("flow")
        await clock.advance(1)
        assert (await app.get_run(run.id)).status == "succeeded"
        history = await export(app, run.id)
    again = shoal.App("shop", store="memory://")
    register(again)
    with caplog.at_level("DEBUG", logger="shoal"):
        result = await replay(again, history)
    assert result.ok and result.outcome == "returned"
    assert not [r for r in caplog.records if "progress" in str(getattr(r, "event", ""))]


async def test_a_history_with_a_broken_graph_record_is_refused() -> None:
    """The ``graph`` list (LangGraph checkpoints, in base64) is read with the history: a broken
    one is a HistoryFormatError naming it, not a replay that passes."""
    history = await recorded_history("sleeping")
    assert history["graph"] == []                   # a run without a graph
    with pytest.raises(HistoryFormatError, match="is a list of LangGraph checkpoints"):
        History.from_json({**history, "graph": "x"})
    with pytest.raises(HistoryFormatError, match="LangGraph checkpoint 0 of the history"):
        History.from_json({**history, "graph": [{"checkpoint_id": "1", "checkpoint": "%%"}]})
