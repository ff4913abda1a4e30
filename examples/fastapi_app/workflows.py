"""The shop's workflows. ``web_and_worker.py`` serves them in the web process itself; with
``submit_only.py`` a separate worker does: ``shoal worker workflows:app``."""

import os

import shoal

STORE = os.environ.get("SHOP_STORE", "sqlite:///shop.db")

app = shoal.App("shop", store=STORE)


@app.workflow
async def fulfil(ctx: shoal.RunContext, order: dict) -> dict:
    parcel = await ctx.step("ship", lambda: f"parcel-{order['id']}")
    return {"order": order["id"], "parcel": parcel}
