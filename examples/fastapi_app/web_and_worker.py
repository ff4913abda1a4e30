"""A FastAPI service that also executes its runs: the shoal App starts with the ASGI lifespan
(it claims runs, recovers, schedules) and stops gracefully with it. Endpoints dispatch and
report; the console is mounted under /shoal. Serve it with
``uvicorn web_and_worker:api``; each replica (uvicorn worker, pod) is one shoal instance."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request

import shoal
import shoal.web
from workflows import app

try:   # a span per request, from its traceparent header: only when tracing is installed
    # (pip install 'shoal[otel]' opentelemetry-instrumentation-fastapi; docs/fastapi.md)
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
except ImportError:   # shoal[fastapi] alone: the same service, untraced
    FastAPIInstrumentor = None


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    async with app:   # start: migrate, claim and execute runs; close() at shutdown
        yield


api = FastAPI(lifespan=lifespan)
if FastAPIInstrumentor is not None:
    FastAPIInstrumentor.instrument_app(api)
api.mount("/shoal", shoal.web.asgi(app))   # the console, reading through the same App


@api.post("/orders/{order_id}", status_code=201)
async def place_order(order_id: int, request: Request) -> dict[str, Any]:
    # traced, the request's span is current here (FastAPIInstrumentor): the run continues it
    run = await app.dispatch("fulfil", {"id": order_id}, idempotency_key=f"order-{order_id}")
    return {"run": run.id, "status": run.status.value}


@api.get("/runs/{run_id}")
async def run_status(run_id: str) -> dict[str, Any]:
    try:
        run = await app.get_run(run_id)
    except shoal.UnknownRunError:
        raise HTTPException(404, f"no run {run_id}") from None
    return {"run": run.id, "status": run.status.value, "output": run.output}
