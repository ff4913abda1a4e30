"""Pydantic models and dataclasses at the JSON boundary: a workflow's input, its output and a
step's result are stored as JSON and come back as the annotated type, on a replay too; a bad
input is refused at dispatch naming the field, and nothing is stored; a model that no
annotation names is refused. On the memory store under a VirtualClock."""

from __future__ import annotations

import datetime
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic
import pydantic.alias_generators
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


# -- aliases, values that cannot be stored, invalid models, unresolvable annotations --------

class Customer(pydantic.BaseModel):
    customer_name: str = pydantic.Field(alias="customerName")
    home: Address | None = None


class Address(pydantic.BaseModel):
    street_name: str = pydantic.Field(alias="streetName")


Customer.model_rebuild()


class ByName(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(validate_by_name=True, validate_by_alias=False)
    customer_name: str = pydantic.Field(alias="customerName")


class Populated(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(populate_by_name=True)
    customer_name: str = pydantic.Field(alias="customerName")


class Generated(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(alias_generator=pydantic.alias_generators.to_camel,
                                       serialize_by_alias=True)
    customer_name: str


class TwoAliases(pydantic.BaseModel):
    customer_name: str = pydantic.Field(validation_alias="in_name",
                                        serialization_alias="outName")


class Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(strict=True)
    at: datetime.datetime
    pair: tuple[int, int]


class Login(pydantic.BaseModel):
    user: str
    password: pydantic.SecretStr


class Holder(pydantic.BaseModel):
    logins: list[Login]


def login() -> Login:
    return Login(user="u", password=pydantic.SecretStr("hunter2"))


def rename(c: Customer) -> Customer:
    return Customer.model_validate({"customerName": c.customer_name.upper(),
                                    "home": {"streetName": "high st"}})


def invalid_order() -> Order:
    return Order.model_construct(customer="c")     # no amount: not a valid Order


@pytest.mark.parametrize("model, given", [
    (Customer, {"customerName": "ann"}),
    (ByName, {"customer_name": "ann"}),
    (Populated, {"customerName": "ann"}),
    (Populated, {"customer_name": "ann"}),
    (Generated, {"customerName": "ann"}),
    (TwoAliases, {"in_name": "ann"}),
])
async def test_a_model_with_aliases_round_trips_through_the_store(
        model: type[pydantic.BaseModel], given: dict[str, Any]) -> None:
    """Whatever the model's alias configuration, its value is stored by field name and loaded
    back by it: as the input, a step's result, the output, ``app.result`` and a child's."""
    app, clock = make_app()
    seen: list[Any] = []

    def echo(value: Any) -> Any:
        return value
    echo.__annotations__["return"] = model

    async def child(ctx: shoal.RunContext, value: Any) -> Any:
        return value
    child.__annotations__.update(value=model, ctx=shoal.RunContext)
    child.__annotations__["return"] = model
    kid = app.workflow(child)

    async def parent(ctx: shoal.RunContext, value: Any) -> Any:
        again = await ctx.step("echo", echo, value)
        await ctx.sleep(5)                       # delivered again: the step replays
        back = await (await ctx.start_child(kid, again)).result()
        seen.append((value, again, back))
        return back
    parent.__annotations__.update(value=model, ctx=shoal.RunContext)
    parent.__annotations__["return"] = model
    wf = app.workflow(parent)

    async with app:
        run = await app.dispatch(wf, given)
        await clock.advance(6)
        for _ in range(3):
            await clock.advance(1)
        result = await app.result(run, timeout=0)
        stored = await app.get_run(run.id)
    expected = model.model_validate(given)
    assert result == expected and type(result) is model
    assert seen[-1] == (expected, expected, expected)
    assert stored.input == stored.output
    assert stored.input["customer_name"] == "ann"       # by field name, whatever the aliases


async def test_nested_aliased_models_round_trip_and_a_dict_may_use_either_spelling() -> None:
    app, clock = make_app()

    @app.workflow
    async def wf(ctx: shoal.RunContext, c: Customer) -> Customer:
        return await ctx.step("rename", rename, c)

    async with app:
        a = await app.dispatch(wf, {"customerName": "ann"})
        b = await app.dispatch(wf, Customer.model_validate({"customerName": "bo"}))
        await clock.advance(1)
        assert await app.result(a, timeout=0) == Customer.model_validate(
            {"customerName": "ANN", "home": {"streetName": "high st"}})
        assert (await app.result(b, timeout=0)).customer_name == "BO"
        assert (await app.get_run(a.id)).output == {
            "customer_name": "ANN", "home": {"street_name": "high st"}}


async def test_a_strict_model_round_trips_through_its_json() -> None:
    app, clock = make_app()
    at = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)

    @app.workflow
    async def wf(ctx: shoal.RunContext, s: Strict) -> Strict:
        return s

    async with app:
        run = await app.dispatch(wf, Strict(at=at, pair=(1, 2)))
        await clock.advance(1)
        assert await app.result(run, timeout=0) == Strict(at=at, pair=(1, 2))


async def test_a_secret_is_refused_where_it_would_be_stored_naming_the_field() -> None:
    """A SecretStr is dumped as '**********': it cannot come back, so it is refused at dispatch
    (nothing stored), as a step's result and as an output, each naming the field."""
    app, clock = make_app()

    @app.workflow
    async def signup(ctx: shoal.RunContext, who: Holder) -> None:
        return None

    @app.workflow(max_attempts=1)
    async def stepped(ctx: shoal.RunContext, input: None) -> None:
        await ctx.step("login", login)

    @app.workflow(max_attempts=1)
    async def returned(ctx: shoal.RunContext, input: None) -> Login:
        return login()

    async with app:
        given = Holder(logins=[login()])
        with pytest.raises(TypeError, match=r"the input of workflow 'signup' cannot be stored: "
                                            r"logins\[0\]\.password is a SecretStr"):
            await app.dispatch(signup, given)
        with pytest.raises(TypeError, match=r"logins\[0\]\.password is a SecretStr"):
            await app.dispatch("signup", given, allow_unregistered=True)
        assert await app.list_runs() == []
        a = await app.dispatch(stepped)
        b = await app.dispatch(returned)
        await clock.advance(1)
        with pytest.raises(shoal.RunFailedError, match=r"the result of step 'login' cannot be "
                                                       r"stored: password is a SecretStr"):
            await app.result(a, timeout=0)
        with pytest.raises(shoal.RunFailedError, match=r"the output of workflow 'returned' "
                                                       r"cannot be stored: password is a Secret"):
            await app.result(b, timeout=0)
        assert (await app.get_run(b.id)).output is None


async def test_an_invalid_model_fails_where_it_is_produced() -> None:
    """A model that is not valid (built with model_construct, or changed without validation)
    fails the attempt that made it, as an invalid dict does; it is never stored as success."""
    app, clock = make_app()

    @app.workflow(max_attempts=1)
    async def output(ctx: shoal.RunContext, input: None) -> Order:
        return invalid_order()

    @app.workflow(max_attempts=1)
    async def step(ctx: shoal.RunContext, input: None) -> None:
        await ctx.step("make", invalid_order)

    @app.workflow(max_attempts=1)
    async def changed(ctx: shoal.RunContext, input: None) -> Order:
        order = Order(customer="c", amount=1)
        order.amount = "lots"  # type: ignore[assignment]
        return order

    @app.workflow(max_attempts=1)
    async def parent(ctx: shoal.RunContext, input: None) -> int:
        child = await ctx.start_child(output, None)
        try:
            await child.result()
        except shoal.RunFailedError as e:
            return 1 if "amount: Field required" in str(e) else 2
        return 0

    async with app:
        runs = [await app.dispatch(w) for w in (output, step, changed, parent)]
        for _ in range(4):
            await clock.advance(1)
        for run, match in zip(runs[:3], [
                r"the output of workflow 'output' is not a valid Order: amount: Field required",
                r"the result of step 'make' is not a valid Order: amount: Field required",
                r"not a valid Order: amount: Input should be a valid integer"], strict=True):
            with pytest.raises(shoal.RunFailedError, match=match):
                await app.result(run, timeout=0)
            stored = await app.get_run(run.id)
            assert stored.status == shoal.RunStatus.FAILED and stored.output is None
        assert await app.result(runs[3], timeout=0) == 1


def test_a_model_defined_in_a_function_under_future_annotations_is_refused() -> None:
    """Under ``from __future__ import annotations`` (this module) an annotation is a string,
    resolved from the module's globals: a model defined inside a function is not there. The
    workflow is refused at registration, saying why and what to do."""
    app, _ = make_app()

    class Local(pydantic.BaseModel):
        x: int

    @dataclass
    class Outer:
        inner: Local | None = None

    with pytest.raises(shoal.ConfigurationError,
                       match=r"input of workflow 'takes'.*'Local'.*cannot be resolved from the "
                             r"globals of module .*test_typed_values.*Define Local at module "
                             r"level.*from __future__ import annotations"):
        @app.workflow
        async def takes(ctx: shoal.RunContext, value: Local) -> None:
            return None

    with pytest.raises(shoal.ConfigurationError, match=r"return type of workflow 'gives'.*'Local"):
        @app.workflow
        async def gives(ctx: shoal.RunContext, value: None) -> list[Local]:
            return []
    assert app._registry.workflows == {}

    with pytest.raises(shoal.ConfigurationError,
                       match=r"The return type of workflow 'nested' names Outer, and the "
                             r"annotation of field 'inner' of dataclass Outer is the "
                             r"string 'Local \| None', which cannot be resolved"):
        async def nested(ctx: shoal.RunContext, value: None) -> Outer:
            return Outer()
        nested.__annotations__["return"] = Outer     # resolved: its field is not
        app.workflow(nested)
    assert app._registry.workflows == {}

    @app.workflow       # a name of the module's globals resolves, local function or not
    async def fine(ctx: shoal.RunContext, value: Order) -> Receipt | None:
        return None
    assert fine.types.input is not None


async def test_a_step_returning_a_model_its_annotation_cannot_name_says_why() -> None:
    app, clock = make_app()

    class Local(pydantic.BaseModel):
        x: int

    def make() -> Local:
        return Local(x=1)

    @app.workflow(max_attempts=1)
    async def wf(ctx: shoal.RunContext, input: None) -> None:
        await ctx.step("make", make)

    async with app:
        run = await app.dispatch(wf)
        await clock.advance(1)
        with pytest.raises(shoal.RunFailedError) as e:
            await app.result(run, timeout=0)
    assert "no annotation names its type" not in str(e.value)
    assert ("the return type of the function of step 'make' is the string 'Local', which "
            "cannot be resolved from the globals of module" in str(e.value))


if TYPE_CHECKING:
    Unimported = Order      # a name the type checker knows, and the module at run time does not


async def checked_only(ctx: shoal.RunContext, order: Unimported) -> None:
    return None


async def test_a_module_level_annotation_that_does_not_resolve_refuses_a_model_saying_why() -> (
        None):
    """A module-level function may name a class defined further down, so it is registered;
    its unresolved annotation means JSON, and a model given for it is refused, saying why."""
    app, _ = make_app()
    wf = app.workflow(checked_only)
    async with app:
        with pytest.raises(TypeError, match=r"the input of workflow 'checked_only' is a Order "
                                            r"\(a pydantic model\), but the annotation of "
                                            r"parameter 'order' is the string 'Unimported', "
                                            r"which cannot be resolved"):
            await app.dispatch(wf, Order(customer="c", amount=1))
        run = await app.dispatch(wf, {"customer": "c"})
    assert run.input == {"customer": "c"}
