"""The shop's workflows. ``web_and_worker.py`` serves them in the web process itself; with
``submit_only.py`` a separate worker does: ``shoal worker workflows:app``."""

import importlib.util
import os

import shoal

STORE = os.environ.get("SHOP_STORE", "sqlite:///shop.db")
# Traced when OpenTelemetry is installed (pip install 'shoal[otel]'): a run then continues the
# trace of the request that dispatched it (docs/fastapi.md). shoal[fastapi] alone: untraced.
TRACING = importlib.util.find_spec("opentelemetry") is not None

app = shoal.App("shop", store=STORE, tracing=TRACING)


@app.workflow
async def fulfil(ctx: shoal.RunContext, order: dict) -> dict:
    parcel = await ctx.step("ship", lambda: f"parcel-{order['id']}")
    return {"order": order["id"], "parcel": parcel}
