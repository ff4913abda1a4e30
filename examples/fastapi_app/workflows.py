"""The shop's workflows. ``web_and_worker.py`` serves them in the web process itself; with
``submit_only.py`` a separate worker does: ``shoal worker workflows:app``."""

import os

import shoal

STORE = os.environ.get("SHOP_STORE", "sqlite:///shop.db")

# tracing=True: a run continues the trace of the request that dispatched it (docs/fastapi.md)
app = shoal.App("shop", store=STORE, tracing=True)


@app.workflow
async def fulfil(ctx: shoal.RunContext, order: dict) -> dict:
    parcel = await ctx.step("ship", lambda: f"parcel-{order['id']}")
    return {"order": order["id"], "parcel": parcel}
