"""``shoal.logs``: the JSON formatter, ``configure``, and the fields that tie a record to its
instance and run (several Apps in one process each stamp their own)."""

from __future__ import annotations

import contextvars
import io
import json
import logging
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest

import shoal
from shoal import logs
from shoal.backends.memory import MemoryStore
from shoal.scope import current_run
from shoal.testing import VirtualClock, settle

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture(autouse=True)
def root_logger() -> Iterator[None]:
    """Each test leaves the root logger (handlers, level) as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    text = stream.getvalue()
    return [json.loads(line) for line in text.splitlines()]


def format_one(logger: logging.Logger, emit: Any) -> dict[str, Any]:
    """What JsonFormatter writes for the one record ``emit(logger)`` logs."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    text = stream.getvalue()
    assert text.count("\n") == 1, text          # one record, one line
    line: dict[str, Any] = json.loads(text)
    return line


def test_a_record_with_every_field() -> None:
    before = datetime.now(UTC)
    line = format_one(logging.getLogger("shoal.test"), lambda log: log.warning(
        "run.retry: %s %s", "settle", "r-1",
        extra={"event": "run.retry", "run_id": "r-1", "workflow": "settle", "tenant": "acme",
               "instance": "api-1"}))
    assert list(line) == ["time", "level", "logger", "event", "run_id", "workflow", "tenant",
                          "instance", "message"]
    assert line["level"] == "warning" and line["logger"] == "shoal.test"
    assert line["message"] == "run.retry: settle r-1"
    assert (line["event"], line["run_id"], line["workflow"], line["tenant"],
            line["instance"]) == ("run.retry", "r-1", "settle", "acme", "api-1")
    assert TIME.match(line["time"]), line["time"]
    at = datetime.fromisoformat(line["time"].replace("Z", "+00:00"))
    assert at.tzinfo is not None and at.utcoffset() is not None and not at.utcoffset()
    assert abs((at - before).total_seconds()) < 60


def test_unknown_fields_are_left_out_not_null() -> None:
    line = format_one(logging.getLogger("billing"), lambda log: log.info(
        "plain", extra={"run_id": None, "event": None}))
    assert line.keys() == {"time", "level", "logger", "message"}
    assert (line["level"], line["logger"], line["message"]) == ("info", "billing", "plain")


def test_the_traceback_goes_under_error_on_the_same_line() -> None:
    def emit(log: logging.Logger) -> None:
        try:
            raise ValueError("bad input\nsecond line")
        except ValueError:
            log.exception("charge failed", extra={"event": "charge.failed"})

    line = format_one(logging.getLogger("billing"), emit)
    assert line["level"] == "error" and line["message"] == "charge failed"
    assert line["error"].startswith("Traceback (most recent call last):")
    assert line["error"].endswith("ValueError: bad input\nsecond line")
    assert "stack" not in line

    line = format_one(logging.getLogger("billing"),
                      lambda log: log.info("where", stack_info=True))
    assert "error" not in line and line["stack"].startswith("Stack (most recent call last):")


def test_other_extra_keys_and_values_that_are_not_json() -> None:
    class Thing:
        def __str__(self) -> str:
            return "a thing"

    line = format_one(logging.getLogger("shoal"), lambda log: log.warning(
        "poll.failed", extra={"event": "poll.failed", "service": "recovery", "thing": Thing(),
                              "count": 3, "_private": 1}))
    assert line["service"] == "recovery" and line["thing"] == "a thing" and line["count"] == 3
    assert "_private" not in line
    # a NaN is not JSON, nor is a dict with keys that are not str: the line stays JSON
    line = format_one(logging.getLogger("shoal"), lambda log: log.info(
        "odd", extra={"ratio": math.nan, "by_pair": {(1, 2): "x"}}))
    assert line["ratio"] == "nan" and line["by_pair"] == "{(1, 2): 'x'}"
    assert line["message"] == "odd"


def test_configure_formats_every_logger_and_replaces_itself() -> None:
    first = io.StringIO()
    logs.configure("json", level="info", stream=first)
    stream = io.StringIO()
    handler = logs.configure("json", level="INFO", stream=stream)   # replaces the first
    assert handler in logging.getLogger().handlers
    logging.getLogger("billing.jobs").info("user line", extra={"order": 7})
    logging.getLogger("shoal").warning("lock.lost: x", extra={"event": "lock.lost"})
    logging.getLogger("billing.jobs").debug("below the level")
    assert first.getvalue() == ""
    lines = json_lines(stream)
    assert [(r["logger"], r["message"]) for r in lines] == [
        ("billing.jobs", "user line"), ("shoal", "lock.lost: x")]
    assert lines[0]["order"] == 7 and lines[1]["event"] == "lock.lost"

    text = io.StringIO()
    logs.configure("text", level=logging.DEBUG, stream=text)
    logging.getLogger("billing.jobs").debug("now shown")
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} DEBUG   billing\.jobs: now shown\n$",
                    text.getvalue()), text.getvalue()
    assert stream.getvalue().count("\n") == 2       # the JSON handler was replaced


def test_the_format_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    assert logs.log_format() == "text"
    monkeypatch.setenv(logs.FORMAT_ENV, "JSON")
    assert logs.log_format() == "json"
    assert logs.log_format("text") == "text"         # given beats the environment
    stream = io.StringIO()
    logs.configure(stream=stream)
    logging.getLogger("billing").warning("from the env")
    assert json_lines(stream)[0]["message"] == "from the env"

    monkeypatch.setenv(logs.FORMAT_ENV, "yaml")
    with pytest.raises(ValueError, match=r"SHOAL_LOG_FORMAT.*'text' or 'json', not 'yaml'"):
        logs.configure()
    with pytest.raises(ValueError, match=r"format.*not 'xml'"):
        logs.configure("xml")
    with pytest.raises(ValueError, match=r"log level .* not 'loud'"):
        logs.configure("text", level="loud")


def test_the_run_fields_come_from_the_run_being_executed() -> None:
    run = SimpleNamespace(run_id="r-1", root_id="r-1", workflow="settle", tenant="acme")
    stamp = logs.ContextFilter()

    def record(**extra: Any) -> logging.LogRecord:
        r = logging.LogRecord("billing", logging.INFO, __file__, 1, "m", None, None)
        r.__dict__.update(extra)
        return r

    def inside_the_run() -> list[logging.LogRecord]:
        current_run.set(run)  # type: ignore[arg-type]
        logs.current_instance.set("api-1")
        plain, own, other = record(), record(instance="api-9"), record(run_id="r-2")
        for r in (plain, own, other):
            assert stamp.filter(r) is True
        return [plain, own, other]

    plain, own, other = contextvars.copy_context().run(inside_the_run)
    assert (plain.run_id, plain.workflow, plain.tenant, plain.instance) == (  # type: ignore[attr-defined]
        "r-1", "settle", "acme", "api-1")
    assert own.instance == "api-9"                      # type: ignore[attr-defined]
    # a record about another run (a child, say) is not given this run's workflow and tenant
    assert other.run_id == "r-2" and not hasattr(other, "workflow")  # type: ignore[attr-defined]
    outside = record()
    stamp.filter(outside)
    assert not hasattr(outside, "instance") and not hasattr(outside, "run_id")


class Refusing(MemoryStore):
    """A memory store whose recovery query fails, naming the store's ``tag``."""

    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    async def recover_runs(self, namespace: str, now: float) -> list[shoal.Run]:
        raise ConnectionError(f"{self.tag}: recover_runs refused")


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_each_app_in_a_process_stamps_its_own_instance() -> None:
    records = Records()                   # a handler of the user's own: no shoal.logs there
    logging.getLogger("shoal").addHandler(records)
    stream = io.StringIO()
    logs.configure("json", stream=stream)
    clock = VirtualClock()
    apps = [shoal.App("billing", store=Refusing(tag), clock=clock, instance_id=tag,
                      lease=30.0) for tag in ("a", "b")]
    for app in apps:
        @app.workflow
        async def charge(ctx: shoal.RunContext, input: Any) -> None:
            logging.getLogger("billing").info("charging %s", input)

    try:
        for app in apps:
            await app.start()
        await clock.advance(10)           # a poll on each app fails
        await settle()
        for app in apps:
            await app.dispatch("charge", app.instance_id)
        await settle()
        logging.getLogger("shoal").info("not of any app")   # the caller's context has none
    finally:
        for app in apps:
            await app.close()
        logging.getLogger("shoal").removeHandler(records)

    failed = [r for r in records.records if getattr(r, "event", None) == "poll.failed"]
    assert {r.getMessage().split(": ")[3] for r in failed} == {"a", "b"}
    for r in failed:
        assert r.instance == r.getMessage().split(": ")[3]  # type: ignore[attr-defined]
    outside = next(r for r in records.records if r.getMessage() == "not of any app")
    assert getattr(outside, "instance", None) is None

    lines = json_lines(stream)
    charging = [r for r in lines if r["logger"] == "billing"]
    assert sorted((r["message"], r["instance"], r["workflow"], r["tenant"]) for r in charging) == [
        ("charging a", "a", "charge", "default"), ("charging b", "b", "charge", "default")]
    assert all(r["run_id"] for r in charging)
    started = [r for r in lines if r.get("event") == "app.started"]
    assert sorted(r["instance"] for r in started) == ["a", "b"]
