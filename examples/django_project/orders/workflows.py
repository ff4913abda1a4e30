"""The shop's workflows, served by ``python manage.py shoal_worker`` (settings.SHOAL['APP']).
The web process never imports this module: it dispatches by name."""

import shoal
from shoal.integrations.django import make_app

from orders.models import Order

app = make_app(max_concurrent_runs=4)


def ship(order_id: int) -> str:
    # a sync step runs in a worker thread, where the ORM may be used as in a view
    Order.objects.filter(id=order_id).update(status="shipped")
    return f"parcel-{order_id}"


@app.workflow
async def fulfil(ctx: shoal.RunContext, input: dict) -> dict:
    parcel = await ctx.step("ship", ship, input["order"])
    return {"order": input["order"], "parcel": parcel}
