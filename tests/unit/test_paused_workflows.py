"""``app.pause_workflow``, ``resume_workflow`` and ``paused_workflows`` on the memory store under a
VirtualClock: the options checked by name, the pause seen by every app of the store, the runs
held back and started again (the store's part runs on every backend in shoal.testing.contract)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from helpers import status_is, until

import shoal
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock


def make_app(store: shoal.Store, **kw: Any) -> shoal.App:
    return shoal.App("test", store=store, clock=VirtualClock(), lease=30.0, **kw)


async def test_a_paused_workflow_starts_nothing_until_resumed() -> None:
    store = MemoryStore()
    app = make_app(store, instance_id="worker")

    @app.workflow()
    async def report(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    @app.workflow()
    async def invoice(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app:
        # another process pauses it, by name
        admin = make_app(store, instance_id="admin")
        async with admin.open():
            assert await admin.pause_workflow("report")
            assert not await admin.pause_workflow("report")    # paused already
        [paused] = await app.paused_workflows()
        assert (paused.workflow, paused.tenant) == ("report", None)
        held = await app.dispatch(report, 1)                  # dispatch still queues
        other = await app.dispatch(invoice, 2)
        await until(status_is(app, other.id, "succeeded"))
        assert (await app.get_run(held.id)).status == "queued"
        assert await app.resume_workflow(report)
        assert not await app.resume_workflow(report)
        await until(status_is(app, held.id, "succeeded"))
        assert await app.paused_workflows() == []


async def test_a_tenants_pause_holds_back_that_tenant_only() -> None:
    app = make_app(MemoryStore())

    @app.workflow()
    async def report(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app:
        assert await app.pause_workflow("report", tenant="acme")
        acme = await app.dispatch(report, 1, tenant="acme")
        plain = await app.dispatch(report, 2)
        await until(status_is(app, plain.id, "succeeded"))
        assert (await app.get_run(acme.id)).status == "queued"
        assert [(p.workflow, p.tenant) for p in await app.paused_workflows()] == [
            ("report", "acme")]
        assert not await app.resume_workflow("report")       # every tenant: not paused so
        assert await app.resume_workflow("report", tenant="acme")
        await until(status_is(app, acme.id, "succeeded"))


async def test_a_workflow_only_another_instance_registered_can_be_paused() -> None:
    store = MemoryStore()
    worker = make_app(store)

    @worker.workflow()
    async def report(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with worker:
        client = make_app(store)
        async with client.open():
            assert await client.pause_workflow("report")
            assert [p.workflow for p in await worker.paused_workflows()] == ["report"]


@pytest.mark.parametrize(("args", "error", "names"), [
    (("nope",), shoal.UnknownWorkflowError, "'nope'"),
    (("",), ValueError, "app.pause_workflow(name)"),
    ((42,), TypeError, "app.pause_workflow(name)"),
    (("report", ""), ValueError, "app.pause_workflow(tenant)"),
    (("report", 7), TypeError, "app.pause_workflow(tenant)"),
])
async def test_the_options_are_checked_by_name(args: tuple[Any, ...], error: type[Exception],
                                               names: str) -> None:
    store = MemoryStore()
    app = make_app(store)

    @app.workflow()
    async def report(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app.open():
        with pytest.raises(error, match=re.escape(names)):
            await app.pause_workflow(*args)
        with pytest.raises(error, match=re.escape(names.replace("pause", "resume"))):
            await app.resume_workflow(*args)
        assert await app.paused_workflows() == []
