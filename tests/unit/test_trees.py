"""Child runs and request-wide tree state, across instances."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import until

import shoal
from shoal.testing import VirtualClock, cluster


def make(store: shoal.Store, clock: shoal.Clock, instance_id: str) -> shoal.App:
    app = shoal.App("trees", store=store, clock=clock, instance_id=instance_id, lease=30.0,
                    max_concurrent_runs=1)
    ran: list[str] = []
    app.ran = ran  # type: ignore[attr-defined]

    @app.workflow(name="research")
    async def research(ctx: shoal.RunContext, input: Any) -> Any:
        children = [await ctx.start_child("topic", {"topic": t}) for t in input["topics"]]
        results = [await child.result() for child in children]
        return {"results": results, "on": instance_id}

    @app.workflow(name="topic", max_attempts=1)
    async def topic(ctx: shoal.RunContext, input: Any) -> Any:
        await ctx.step("record", lambda: ran.append(input["topic"]))
        if input["topic"] == "boom":
            raise ValueError("no sources")
        if input["topic"] == "slow":
            await ctx.sleep(100)
        if input["topic"] == "stuck":
            await ctx.step("forever", asyncio.Event().wait)
        first = await ctx.tree.save_if_absent(f"subtopic:{input['topic'][0]}", ctx.run_id)
        owner = await ctx.tree.get(f"subtopic:{input['topic'][0]}")
        return {"topic": input["topic"], "first": first, "owner_is_me": owner == ctx.run_id,
                "root": ctx.root_id}

    @app.workflow(name="careful")
    async def careful(ctx: shoal.RunContext, input: Any) -> Any:
        child = await ctx.start_child("topic", {"topic": "boom"})
        try:
            await child.result()
        except shoal.RunFailedError as e:
            return {"child_failed": str(e)}
        return None

    return app


async def test_children_share_the_root_and_wake_the_parent_on_another_instance() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=2, clock=clock) as (a, b):
        run = await a.dispatch("research", {"topics": ["apples", "avocados", "slow"]})
        await until(lambda: _children_started(a, run.id, 3))
        await clock.advance(100)                         # the slow child sleeps durably
        out = await b.result(run.id)
        results = out["results"]
        assert [r["topic"] for r in results] == ["apples", "avocados", "slow"]
        assert {r["root"] for r in results} == {run.id}
        # two children race for "subtopic:a": exactly one wins; both see the winner's value
        a_results = [r for r in results if r["topic"].startswith("a")]
        assert sorted(r["first"] for r in a_results) == [False, True]
        assert all(r["owner_is_me"] == r["first"] for r in a_results)
        children = [r for r in await a.list_runs(workflow="topic")]
        assert {c.parent_id for c in children} == {run.id}
        assert {c.root_id for c in children} == {run.id}
        # each child ran once: replays of the parent never start a second one
        assert sorted(a.ran + b.ran) == ["apples", "avocados", "slow"]  # type: ignore[attr-defined]
        # the tree's keys went with the root
        assert await a.store.get_tree_key(run.id, "subtopic:a") is None


async def _children_started(app: shoal.App, parent_id: str, n: int) -> bool:
    kids = [r for r in await app.list_runs(workflow="topic") if r.parent_id == parent_id]
    return len(kids) >= n


async def test_a_failed_child_raises_in_the_parent() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=2, clock=clock) as (a, _b):
        run = await a.dispatch("careful")
        out = await a.result(run.id)
        assert "no sources" in out["child_failed"]


async def test_cancelling_the_root_cancels_its_children() -> None:
    clock = VirtualClock()
    async with cluster(make, instances=1, clock=clock) as (a,):
        run = await a.dispatch("research", {"topics": ["slow", "stuck"]})
        await until(lambda: _children_started(a, run.id, 2))
        await until(lambda: _status(a, "topic", "sleeping"))
        await until(lambda: _status(a, "topic", "running"))
        await a.cancel(run.id)
        with pytest.raises(shoal.RunCancelledError):
            await a.result(run.id)

        async def kids_cancelled() -> bool:
            kids = await a.list_runs(workflow="topic")
            return [k.status for k in kids] == ["cancelled", "cancelled"]

        await until(kids_cancelled)


async def _status(app: shoal.App, workflow: str, status: str) -> bool:
    return any(r.status == status for r in await app.list_runs(workflow=workflow))


async def test_start_child_refuses_unknown_options() -> None:
    clock = VirtualClock()
    app = shoal.App("trees", store="memory://", clock=clock)
    errors: list[str] = []

    @app.workflow(max_attempts=1)
    async def parent(ctx: shoal.RunContext, input: Any) -> None:
        try:
            await ctx.start_child(parent, {}, colour="red")
        except TypeError as e:
            errors.append(str(e))
            raise

    async with app:
        run = await app.dispatch(parent)
        with pytest.raises(shoal.RunFailedError):
            await app.result(run.id)
        assert errors and "colour" in errors[0]
        await asyncio.sleep(0)


async def test_a_child_finished_on_one_instance_wakes_its_parent_on_the_other() -> None:
    clock = VirtualClock()
    executed: list[tuple[str, str]] = []

    def split(store: shoal.Store, clk: shoal.Clock, name: str) -> shoal.App:
        app = shoal.App("split", store=store, clock=clk, instance_id=name, lease=30.0)
        if name == "instance-0":            # this one only runs parents

            @app.workflow(name="parent")
            async def parent(ctx: shoal.RunContext, input: Any) -> Any:
                child = await ctx.start_child("child", {"n": 2})
                doubled = await child.result()
                await ctx.step("after", lambda: executed.append((name, "parent-after")))
                return doubled
        else:                               # and this one only children

            @app.workflow(name="child")
            async def child(ctx: shoal.RunContext, input: Any) -> Any:
                await ctx.step("work", lambda: executed.append((name, "child")))
                return input["n"] * 2

        return app

    async with cluster(split, instances=2, clock=clock) as (a, b):
        run = await a.dispatch("parent")
        assert await b.result(run.id) == 4
        assert executed == [("instance-1", "child"), ("instance-0", "parent-after")]
        [kid] = await a.list_runs(workflow="child")
        assert kid.owner is None and kid.parent_id == run.id


async def test_a_child_that_no_longer_exists_fails_in_the_parent() -> None:
    from shoal.backends.memory import MemoryStore

    store, clock = MemoryStore(), VirtualClock()
    app = shoal.App("gone", store=store, clock=clock, lease=30.0)

    @app.workflow(name="kid")
    async def kid(ctx: shoal.RunContext, input: Any) -> None:
        await ctx.sleep(3600)

    @app.workflow(name="parent")
    async def parent(ctx: shoal.RunContext, input: Any) -> str:
        child = await ctx.start_child("kid")
        try:
            await child.result()
        except shoal.RunFailedError as e:
            return f"failed: {e.error}"
        return "ok"

    async with app:
        run = await app.dispatch("parent")
        await until(lambda: _status(app, "parent", "waiting"))
        [child] = await app.list_runs(workflow="kid")
        store._runs.pop(child.id)        # pruned while its parent waited (a long outage)
        # what the child's end would do: make the waiting parent due
        await store.send_signal(run.id, f"shoal.child:{child.id}", None, "sig-1", clock.now())
        app._engine.kick()  # type: ignore[union-attr]
        out = await app.result(run.id)
        assert out.startswith("failed: child run") and "no longer exists" in out
        assert (await app.get_run(run.id)).attempts == 1
