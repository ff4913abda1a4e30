"""The helpers that make a batch of runs cheap (``app.dispatch_many``): the JSON check's fast path
gives every value the answer of the full check, ids made in bulk are the ids made one by one,
and a run built for a batch equals the one ``Run(...)`` builds."""

from __future__ import annotations

import dataclasses
import re
import uuid
from typing import Any

import pytest

from shoal import _ids, _json
from shoal._json import MAX_DEPTH
from shoal.backends._batches import queued_run
from shoal.types import NewRun, Run, RunStatus


def nested(depth: int, leaf: Any = None) -> Any:
    value: Any = [] if leaf is None else leaf
    for _ in range(depth):
        value = [value]
    return value


def circular() -> Any:
    value: list[Any] = [1]
    value.append({"again": value})
    return value


class Weird(int):
    """An int subclass: JSON takes it as the int it is."""


VALUES: list[Any] = [
    None, True, 0, -7, 2**70, 2.5, -0.0, 1e300, "", "é\u2028\x00\"\\", [], {},
    {"a": [1, {"b": None}], "c": "x"}, [1, "two", None, True, 2.5], {"n": Weird(3)},
    (1, 2), {"t": ("a", ["b"])},                      # tuples: kept as lists
    nested(MAX_DEPTH - 1), nested(MAX_DEPTH), nested(MAX_DEPTH - 3, "[" * 300),
    {1: "a"}, {"1": 1, 1: 2}, {True: 1}, {None: 1}, {2.5: 1},   # keys that are not str
    float("nan"), [float("inf")], {"x": -float("inf")},      # no NaN or infinity
    object(), {"a": [1, {1, 2}]}, b"bytes", {"f": len},       # not JSON at all
    nested(MAX_DEPTH + 1), nested(5000), circular(),          # too deep
    {"big": "x" * 200},                                       # over max_bytes below
]


def full_check(value: object, what: str, max_bytes: int) -> tuple[Any, int, str]:
    """What ``checked_text`` answers, by the full check alone."""
    _json.check_json(value, what)
    text = _json.dumps(value)
    if len(text) > max_bytes:
        raise ValueError(f"{what} is {len(text)} bytes of JSON, over the limit of {max_bytes} "
                         f"bytes (App(max_payload_bytes=…)): keep large data elsewhere (a "
                         f"file, an object store) and pass a reference to it")
    return _json.loads(text), len(text), text


def outcome(check: Any, value: object) -> Any:
    try:
        return check(value, "input", 150)
    except Exception as e:   # the exception's type and text are the outcome
        return type(e), str(e)


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_the_json_checks_fast_path_answers_as_the_full_check(value: Any) -> None:
    got = outcome(_json.checked_text, value)
    assert got == outcome(full_check, value)
    if isinstance(got[0], type):
        assert got[0] in (TypeError, ValueError)        # never a RecursionError
    else:
        copy, size, text = got
        assert _json.decode(text) == copy == _json.loads(text) and size == len(text)


def test_the_fast_path_takes_the_plain_values_and_leaves_the_rest_to_the_full_check() -> None:
    for value in ({"a": [1, {"b": None}], "c": "x"}, nested(MAX_DEPTH - 1), ["é"]):
        copy, text = _json._round_trip(value)
        assert text == _json.dumps(value) and copy == value and copy is not value
    for value in ((1, 2), {1: "a"}, nested(MAX_DEPTH - 3, "[" * 300), float("nan"),
                  nested(MAX_DEPTH + 1), circular(), {"f": len}):
        assert _json._round_trip(value) == (None, None)


def test_ids_made_in_bulk_are_ids_made_one_by_one() -> None:
    now = 1_767_225_600.123
    ids = _ids.new_ids(now, 5000)      # more than a millisecond's 4096 sequence numbers
    single = _ids.new_id(now)
    more = _ids.new_ids(now - 60, 3)   # an earlier clock: still after every id before
    everything = [*ids, single, *more]
    assert everything == sorted(everything) and len(set(everything)) == len(everything)
    for text in everything:
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
                            text)
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, text)
    first_ms = uuid.UUID(ids[0]).int >> 80
    assert first_ms >= int(now * 1000)
    assert uuid.UUID(ids[-1]).int >> 80 > first_ms        # the sequence ran over into the next ms
    assert _ids.new_ids(now, 0) == []
    assert len({text[19:] for text in ids}) == len(ids)  # the random part differs


def test_a_run_built_for_a_batch_equals_the_one_run_builds() -> None:
    new = NewRun(id="r1", namespace="ns", tenant="t", workflow="wf", input={"x": (1, 2)},
                 priority=3, created_at=10.0, run_at=11.0, max_attempts=4,
                 concurrency_key="c", idempotency_key="i", version="v", parent_id="p",
                 root_id="root")
    expected = Run(id="r1", namespace="ns", tenant="t", workflow="wf", input={"x": [1, 2]},
                   output=None, error=None, status=RunStatus.QUEUED, priority=3,
                   created_at=10.0, run_at=11.0, attempts=0, max_attempts=4,
                   concurrency_key="c", idempotency_key="i", owner=None,
                   lease_expires_at=None, lease_epoch=0, cancel_requested=False, version="v",
                   parent_id="p", root_id="root", wait_for=None, held=True, started_at=None,
                   finished_at=None)
    for text in (None, '{"x":[1,2]}'):
        run = queued_run(new, True, text)
        assert run == expected and repr(run) == repr(expected) and vars(run) == vars(expected)
        assert set(vars(run)) == {f.name for f in dataclasses.fields(Run)}
        with pytest.raises(dataclasses.FrozenInstanceError):
            run.status = RunStatus.RUNNING   # type: ignore[misc]
    root = queued_run(dataclasses.replace(new, root_id=None), False)
    assert root.root_id == "r1" and not root.held
