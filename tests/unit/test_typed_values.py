"""Pydantic models and dataclasses at the JSON boundary: a workflow's input, its output and a
step's result are stored as JSON and come back as the annotated type, on a replay too; a bad
input is refused at dispatch naming the field, and nothing is stored; a model that no
annotation names is refused. On the memory store under a VirtualClock."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic
import pytest

import shoal
from shoal.testing import VirtualClock


class Order(pydantic.BaseModel):
    customer: str
    amount: int


class Receipt(pydantic.BaseModel):
    order: Order
    charged: int


@dataclass
class Line:
    sku: str
    qty: int = 1


@dataclass
class Quote:
    lines: list[Line]
    total: float
    tags: dict[str, Line] = field(default_factory=dict)
    note: str | None = None


def make_app() -> tuple[shoal.App, VirtualClock]:
    clock = VirtualClock()
    return shoal.App("typed", store="memory://", clock=clock), clock


async def test_models_and_dataclasses_come_back_as_themselves_on_a_replay() -> None:
    app, clock = make_app()
    charged: list[Order] = []
    seen: list[tuple[type, type, type]] = []

    async def charge(order: Order) -> Receipt:
        charged.append(order)
        return Receipt(order=order, charged=order.amount)

    def quote(order: Order) -> Quote:     # a plain function: in a thread
        return Quote([Line("a", order.amount)], order.amount * 1.5, {"x": Line("x")})

    @app.workflow
    async def settle(ctx: shoal.RunContext, order: Order) -> Quote:
        receipt = await ctx.step("charge", charge, order)
        q = await ctx.step("quote", quote, order)
        seen.append((type(order), type(receipt), type(q.lines[0])))
        assert q.tags == {"x": Line("x")}
        await ctx.sleep(60)                      # the run is delivered again: a replay
        return q

    async with app:
        run = await app.dispatch(settle, Order(customer="c1", amount=2))
        await clock.advance(61)
        quote_back = await app.result(run)
        stored = await app.get_run(run.id)
        steps = await app.store.load_steps(run.id)
    assert quote_back == Quote([Line("a", 2)], 3.0, {"x": Line("x")})
    assert len(charged) == 1                     # the replay did not charge again
    assert seen == [(Order, Receipt, Line)] * 2  # the same types first and on the replay
    assert stored.input == {"customer": "c1", "amount": 2}
    assert stored.output == {"lines": [{"sku": "a", "qty": 2}], "total": 3.0,
                             "tags": {"x": {"sku": "x", "qty": 1}}, "note": None}
    assert steps[0].output == {"order": {"customer": "c1", "amount": 2}, "charged": 2}
    assert await app.result(run.id) == quote_back   # an id: the app knows the workflow


async def test_a_bad_input_is_refused_at_dispatch_naming_the_field() -> None:
    app, _ = make_app()

    @app.workflow
    async def settle(ctx: shoal.RunContext, order: Order) -> None:
        return None

    @app.workflow
    async def lines(ctx: shoal.RunContext, line: Line) -> None:
        return None

    async with app:
        with pytest.raises(ValueError, match=r"input of workflow 'settle' is not a valid "
                                             r"Order: amount: Field required"):
            await app.dispatch(settle, {"customer": "c1"})
        with pytest.raises(ValueError, match=r"amount: Input should be a valid integer"):
            await app.dispatch("settle", {"customer": "c1", "amount": "many"})
        with pytest.raises(ValueError, match=r"not a valid Line: unexpected field 'size'"):
            await app.dispatch(lines, {"sku": "a", "size": 3})
        with pytest.raises(ValueError, match=r"not a valid Line: field 'sku' is missing"):
            await app.dispatch(lines, {"qty": 3})
        with pytest.raises(ValueError, match=r"item 1: the input of workflow 'settle' is not "
                                             r"a valid Order: customer: Field required"):
            await app.dispatch_many(settle, [Order(customer="a", amount=1), {"amount": 2}])
        assert await app.list_runs() == []       # nothing was stored
        # JSON that is a valid Order is stored as the model dumps it
        run = await app.dispatch(settle, {"customer": "c1", "amount": "7"})
        assert run.input == {"customer": "c1", "amount": 7}
        [one, two] = await app.dispatch_many(lines, [Line("a"), shoal.DispatchItem({"sku": "b"})])
        assert (one.input, two.input) == ({"sku": "a", "qty": 1}, {"sku": "b", "qty": 1})


async def test_a_model_without_an_annotation_is_refused_with_what_to_annotate() -> None:
    app, clock = make_app()

    def unannotated():  # type: ignore[no-untyped-def]
        return Line("a")

    @app.workflow(max_attempts=1)
    async def step_wf(ctx: shoal.RunContext, input: None) -> None:
        await ctx.step("make", unannotated)

    @app.workflow(max_attempts=1)
    async def output_wf(ctx: shoal.RunContext, input: None) -> Any:
        return Order(customer="c", amount=1)

    async with app:
        a = await app.dispatch(step_wf)
        b = await app.dispatch(output_wf)
        await clock.advance(1)
        with pytest.raises(shoal.RunFailedError) as step_error:
            await app.result(a, timeout=0)
        with pytest.raises(shoal.RunFailedError) as output_error:
            await app.result(b, timeout=0)
    assert ("the result of step 'make' is a Line (a dataclass), but no annotation names its "
            "type: annotate the return type of the function of step 'make' as Line"
            in str(step_error.value))
    assert ("the output of workflow 'output_wf' is a Order (a pydantic model), but no "
            "annotation names its type" in str(output_error.value))


async def test_a_child_of_a_typed_workflow_gives_its_model_back() -> None:
    app, clock = make_app()
    got: list[object] = []

    @app.workflow
    async def price(ctx: shoal.RunContext, order: Order) -> Receipt:
        return Receipt(order=order, charged=order.amount * 2)

    @app.workflow
    async def parent(ctx: shoal.RunContext, input: None) -> int:
        child = await ctx.start_child(price, Order(customer="c", amount=3))
        by_name = await ctx.start_child("price", {"customer": "d", "amount": 1})
        receipt, other = await child.result(), await by_name.result()
        got.extend([receipt, other])
        return receipt.charged + other.charged

    async with app:
        run = await app.dispatch(parent)
        for _ in range(5):
            await clock.advance(1)
        assert await app.result(run, timeout=0) == 8
    assert got[-2:] == [Receipt(order=Order(customer="c", amount=3), charged=6),
                        Receipt(order=Order(customer="d", amount=1), charged=2)]


async def test_a_submitter_without_the_workflow_stores_a_models_json() -> None:
    """An app that does not register the workflow cannot check the input; it stores the
    model's JSON, and the instance that runs the workflow loads (and checks) it."""
    clock = VirtualClock()
    store = shoal.App("typed", store="memory://").store
    worker = shoal.App("typed", store=store, clock=clock, instance_id="worker")
    submitter = shoal.App("typed", store=store, clock=clock, instance_id="web")

    @worker.workflow
    async def settle(ctx: shoal.RunContext, order: Order) -> Receipt:
        return Receipt(order=order, charged=order.amount)

    async with worker, submitter.open():
        run = await submitter.dispatch("settle", Order(customer="c1", amount=4))
        bad = await submitter.dispatch("settle", {"customer": "c1"}, max_attempts=1)
        await clock.advance(1)
        assert run.input == {"customer": "c1", "amount": 4}
        assert await submitter.result(run) == {"order": {"customer": "c1", "amount": 4},
                                               "charged": 4}     # JSON: no annotation here
        assert await worker.result(run) == Receipt(order=Order(customer="c1", amount=4),
                                                   charged=4)
        with pytest.raises(shoal.RunFailedError, match="amount: Field required"):
            await worker.result(bad, timeout=0)


def test_dataclasses_need_no_pydantic(tmp_path: Path) -> None:
    """Without pydantic importable, a dataclass still crosses the boundary both ways; a
    ``ctx`` annotated with a name imported only for the type checker does not stop it."""
    script = tmp_path / "no_pydantic.py"
    script.write_text('''
from __future__ import annotations
import asyncio, sys
from dataclasses import dataclass
from typing import TYPE_CHECKING
sys.modules["pydantic"] = None          # import pydantic raises ImportError
import shoal
from shoal.testing import VirtualClock
if TYPE_CHECKING:
    from shoal import RunContext

@dataclass
class Point:
    x: int
    y: int = 0

def move(p: Point) -> Point:
    return Point(p.x + 1, p.y)

clock = VirtualClock()
app = shoal.App("dc", store="memory://", clock=clock)

@app.workflow
async def walk(ctx: RunContext, p: Point) -> Point:
    assert isinstance(p, Point), p
    q = await ctx.step("move", move, p)
    await ctx.sleep(5)
    return await ctx.step("again", move, q)

async def main() -> None:
    async with app:
        run = await app.dispatch(walk, {"x": 1})
        await clock.advance(6)
        assert await app.result(run, timeout=0) == Point(3, 0)
        assert (await app.get_run(run.id)).output == {"x": 3, "y": 0}
    assert "pydantic" not in sys.modules or sys.modules["pydantic"] is None
    print("ok")

asyncio.run(main())
''')
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
