"""A FastAPI service that only submits work: an AsyncClient opened with the ASGI lifespan (it
connects and never claims a run) dispatches by workflow name, without the workflows' code. A
worker process executes the runs: ``shoal worker workflows:app``. The console is mounted under
/shoal on the client's App."""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException, Request

import shoal
import shoal.web

try:   # a span per request, from its traceparent header: only when tracing is installed
    # (pip install 'shoal[otel]' opentelemetry-instrumentation-fastapi; docs/fastapi.md)
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
except ImportError:   # shoal[fastapi] alone: the same service, untraced
    FastAPIInstrumentor = None

client = shoal.AsyncClient(os.environ.get("SHOP_STORE", "sqlite:///shop.db"), namespace="shop",
                           tracing=FastAPIInstrumentor is not None)


@asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    async with client:   # bound to the server's event loop; closed at shutdown
        yield


api = FastAPI(lifespan=lifespan)
if FastAPIInstrumentor is not None:
    FastAPIInstrumentor.instrument_app(api)
api.mount("/shoal", shoal.web.asgi(client.app))


@api.post("/orders/{order_id}", status_code=201)
async def place_order(order_id: int, request: Request) -> dict[str, Any]:
    # traced, the request's span is current here (FastAPIInstrumentor): the run continues it
    run = await client.dispatch("fulfil", {"id": order_id}, idempotency_key=f"order-{order_id}")
    return {"run": run.id, "status": run.status.value}


@api.get("/runs/{run_id}")
async def run_status(run_id: str) -> dict[str, Any]:
    try:
        run = await client.get_run(run_id)
    except shoal.UnknownRunError:
        raise HTTPException(404, f"no run {run_id}") from None
    return {"run": run.id, "status": run.status.value, "output": run.output}
