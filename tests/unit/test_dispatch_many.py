"""``app.dispatch_many``: a batch of runs of one workflow stored at once, all or nothing, answered
in the order of its inputs, with options per batch and per item (``shoal.DispatchItem``),
idempotency keys per item, admission applied to the batch, and bad input named by its position
with nothing stored. The tests that store something run on memory, SQLite and PostgreSQL (a
schema of the test's own)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import shoal
from shoal import DispatchItem
from shoal.app.options import MAX_BATCH, MAX_BATCH_BYTES
from shoal.backends.memory import MemoryStore
from shoal.testing import VirtualClock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from backends import postgres_schema


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of the test's own on each backend."""
    if request.param == "memory":
        yield "memory://"
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shoal.db'}"
    else:
        with postgres_schema("shoal_many_") as url:
            yield url


def make_app(store: str = "memory://", clock: VirtualClock | None = None,
             **options: Any) -> shoal.App:
    app = shoal.App("many", store=store, clock=clock or VirtualClock(), lease=30.0, **options)

    @app.workflow(priority=1, max_attempts=3,
                  concurrency_key=lambda input: input.get("c") if isinstance(input, dict)
                  else None)
    async def job(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    return app


@pytest.fixture
async def opened(store_url: str) -> AsyncIterator[shoal.App]:
    """An app over the store that dispatches and runs nothing."""
    app = make_app(store_url)
    async with app.open():
        yield app


async def test_each_item_takes_its_own_options_then_the_batchs_then_the_workflows(
    opened: shoal.App,
) -> None:
    app = opened
    runs = await app.dispatch_many("job", [
        {"n": 0},
        DispatchItem({"n": 1}, priority=9, tenant="acme", delay=60, max_attempts=7,
                     concurrency_key="own"),
        {"n": 2, "c": "from-input"},
        DispatchItem(("a", "tuple"), idempotency_key="k", concurrency_key=""),
    ], priority=4, tenant="t", max_attempts=2)
    assert [r.input for r in runs] == [{"n": 0}, {"n": 1}, {"n": 2, "c": "from-input"},
                                       ["a", "tuple"]]
    assert [(r.priority, r.tenant, r.max_attempts, r.concurrency_key, r.idempotency_key)
            for r in runs] == [(4, "t", 2, None, None), (9, "acme", 7, "own", None),
                               (4, "t", 2, "from-input", None), (4, "t", 2, "", "k")]
    assert [r.run_at - r.created_at for r in runs] == [0, 60, 0, 0]   # type: ignore[operator]
    assert all(r.status == shoal.RunStatus.QUEUED and r.root_id == r.id for r in runs)
    assert [r.id for r in runs] == sorted(r.id for r in runs)        # time-ordered, in order
    for run in runs:
        assert await app.get_run(run.id) == run
    # without options: the workflow's; a batch key takes the place of the workflow's function
    plain, keyed = await app.dispatch_many("job", [{"c": "x"}, DispatchItem({"c": "x"},
                                                                            priority=2)])
    assert (plain.priority, plain.max_attempts, plain.tenant, plain.concurrency_key) == (
        1, 3, "default", "x")
    [batch_key] = await app.dispatch_many("job", [{"c": "x"}], concurrency_key="batch")
    assert batch_key.concurrency_key == "batch" and keyed.priority == 2
    assert len(await app.list_runs(tenant="t")) == 3


async def test_idempotency_keys_are_per_item(opened: shoal.App) -> None:
    app = opened
    first = await app.dispatch("job", {"i": "first"}, idempotency_key="a")
    runs = await app.dispatch_many("job", [
        DispatchItem({"i": 0}, idempotency_key="a"),        # taken before: that run
        DispatchItem({"i": 1}, idempotency_key="b"),
        DispatchItem({"i": 2}, idempotency_key="b"),        # twice in the batch: the first's
        {"i": 3},
        DispatchItem({"i": 4}, idempotency_key="b", tenant="other"),   # another tenant's key
    ])
    assert runs[0].id == first.id and runs[0].input == {"i": "first"}
    assert runs[2].id == runs[1].id and runs[2].input == {"i": 1}
    assert len({r.id for r in runs}) == 4
    assert len(await app.list_runs(limit=1000)) == 4
    again = await app.dispatch_many("job", [DispatchItem(None, idempotency_key=k)
                                            for k in ("b", "a")])
    assert [r.id for r in again] == [runs[1].id, first.id]
    assert len(await app.list_runs(limit=1000)) == 4


class KeyFails(Exception):
    pass


def failing_key(input: Any) -> str | None:
    if input == "boom":
        raise KeyFails("no key for this input")
    return 5 if input == "int" else None   # type: ignore[return-value]


@pytest.mark.parametrize("items, error, message", [
    ([1, 2, 3, object()], TypeError, "dispatch_many: item 3: input is a object"),
    ([1, float("nan")], TypeError, "dispatch_many: item 1: input is nan"),
    ([1, [[1]], {"deep": [[]] * 3}, "x" * 300], ValueError,
     "dispatch_many: item 3: input is 302 bytes of JSON, over the limit of 200"),
    ([1, DispatchItem(1, priority="high")], TypeError,  # type: ignore[arg-type]
     r"dispatch_many: item 1: DispatchItem\(priority\) must be an int"),
    ([DispatchItem(1, delay=-1)], ValueError, r"item 0: DispatchItem\(delay\)"),
    ([1, 2, DispatchItem(1, tenant="")], ValueError, r"item 2: DispatchItem\(tenant\)"),
    ([DispatchItem(1, idempotency_key=5)], TypeError,  # type: ignore[arg-type]
     r"item 0: DispatchItem\(idempotency_key\)"),
    ([DispatchItem(1, max_attempts=0)], ValueError, r"item 0: DispatchItem\(max_attempts\)"),
    ([DispatchItem(1, concurrency_key="a\x00b")], ValueError, "item 0: DispatchItem"),
    (["ok", "int"], TypeError, "item 1: the key given by the concurrency_key function"),
])
async def test_a_bad_item_is_named_and_nothing_is_stored(
    items: list[Any], error: type[Exception], message: str, store_url: str,
) -> None:
    app = shoal.App("many", store=store_url, clock=VirtualClock(), max_payload_bytes=200)

    @app.workflow(concurrency_key=failing_key)
    async def keyed(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app.open():
        with pytest.raises(error, match=message):
            await app.dispatch_many(keyed, items)
        assert await app.list_runs() == []
        assert len(await app.dispatch_many(keyed, [1, "ok"])) == 2   # good items are stored


async def test_an_error_of_the_users_key_function_carries_the_item() -> None:
    app = shoal.App("many", store="memory://", clock=VirtualClock())

    @app.workflow(concurrency_key=failing_key)
    async def keyed(ctx: shoal.RunContext, input: Any) -> Any:
        return input

    async with app.open():
        with pytest.raises(KeyFails) as e:
            await app.dispatch_many(keyed, ["a", "b", "boom"])
        assert e.value.__notes__ == ["raised for item 2 of app.dispatch_many"]
        assert await app.list_runs() == []


async def test_the_batch_is_checked_before_anything_is_stored() -> None:
    app = make_app(max_payload_bytes=2_000_000)
    async with app.open():
        with pytest.raises(TypeError, match=r"app.dispatch_many\(priority\) must be an int"):
            await app.dispatch_many("job", [1], priority="high")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"app.dispatch_many\(tenant\)"):
            await app.dispatch_many("job", [1], tenant="")
        with pytest.raises(TypeError, match="idempotency_key"):
            await app.dispatch_many("job", [1], idempotency_key="k")  # type: ignore[call-arg]
        for inputs in ("abc", {"a": 1}, 5, None):
            with pytest.raises(TypeError, match="takes a list of inputs"):
                await app.dispatch_many("job", inputs)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=f"at most {MAX_BATCH} inputs per call, not "
                                             f"{MAX_BATCH + 1}: dispatch them in chunks"):
            await app.dispatch_many("job", [None] * (MAX_BATCH + 1))
        big = "x" * 1_999_990
        with pytest.raises(ValueError, match=f"over the limit of {MAX_BATCH_BYTES} bytes per "
                                             f"call: dispatch the inputs in smaller chunks"):
            await app.dispatch_many("job", [big] * (MAX_BATCH_BYTES // len(big) + 1))
        with pytest.raises(shoal.UnknownWorkflowError):
            await app.dispatch_many("nobody", [1])
        with pytest.raises(TypeError, match=r"registered with @app\.workflow"):
            await app.dispatch_many(print, [1])  # type: ignore[arg-type]
        assert await app.list_runs() == []
        assert await app.dispatch_many("job", []) == []
        # any iterable of items, a generator too; exactly MAX_BATCH items are fine
        assert len(await app.dispatch_many("job", ({"i": i} for i in range(3)))) == 3
        assert len(await app.dispatch_many("job", [None] * MAX_BATCH)) == MAX_BATCH


async def test_a_key_from_input_needs_the_function_or_a_key_for_each_item() -> None:
    store = MemoryStore()
    clock = VirtualClock()
    worker = make_app(store, clock)          # registers "job" with its key function
    async with worker:
        submitter = shoal.App("many", store=store, clock=clock)   # has no "job" of its own
        async with submitter.open():
            with pytest.raises(shoal.ConfigurationError,
                               match="dispatch_many: item 1: Workflow 'job' computes its "
                                     "concurrency key from the input"):
                await submitter.dispatch_many("job", [DispatchItem({}, concurrency_key="a"),
                                                      {"c": "b"}])
            assert await submitter.list_runs() == []
            runs = await submitter.dispatch_many("job", [{"c": "b"}, DispatchItem(
                {}, concurrency_key="a")], concurrency_key="batch")
            assert [r.concurrency_key for r in runs] == ["batch", "a"]


async def test_a_batch_runs_at_once_and_its_delayed_items_in_time() -> None:
    clock = VirtualClock()
    app = make_app(clock=clock, max_concurrent_runs=8)
    async with app:
        runs = await app.dispatch_many("job", [{"n": n} for n in range(5)]
                                       + [DispatchItem({"n": 5}, delay=3600)])
        for run in runs[:5]:
            assert await asyncio.wait_for(app.result(run.id), 10) == run.input
        assert (await app.get_run(runs[5].id)).status == shoal.RunStatus.QUEUED
        await clock.advance(3600)
        assert await asyncio.wait_for(app.result(runs[5].id), 10) == {"n": 5}


async def test_admission_reject_refuses_the_whole_batch(store_url: str) -> None:
    app = make_app(store_url, max_queued=3, admission="reject")
    async with app.open():
        await app.dispatch("job", 0, idempotency_key="zero")
        with pytest.raises(shoal.AdmissionRejectedError,
                           match="has room for 2 more queued runs under max_queued=3, and this "
                                 "batch has 3 new runs; nothing of the batch was stored"):
            await app.dispatch_many("job", [1, 2, 3])
        assert len(await app.list_runs()) == 1
        # a repeat of a stored key is not a new run: three items, two new runs, they fit
        runs = await app.dispatch_many("job", [DispatchItem(0, idempotency_key="zero"), 1, 2])
        assert len(await app.list_runs()) == 3 and not any(r.held for r in runs)


async def test_admission_park_holds_the_items_beyond_the_room(store_url: str) -> None:
    clock = VirtualClock()
    app = make_app(store_url, clock, max_queued=2, admission="park")
    async with app.open():
        runs = await app.dispatch_many("job", list(range(5)))
        assert [r.held for r in runs] == [False, False, True, True, True]
        assert [(await app.get_run(r.id)).held for r in runs] == [r.held for r in runs]
    async with app:
        for _ in range(10):                       # polls release the held runs, oldest first
            if all([(await app.get_run(r.id)).status == "succeeded" for r in runs]):
                break
            await clock.advance(app.lease / 3)
        assert [await asyncio.wait_for(app.result(r.id), 10) for r in runs] == [0, 1, 2, 3, 4]
