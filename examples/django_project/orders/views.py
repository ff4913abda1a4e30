import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import shoal
from shoal.integrations import django as shoal_django

from orders.models import Order


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    item = json.loads(request.body)["item"]
    with transaction.atomic():
        order = Order.objects.create(item=item)
        # in the transaction: the run exists iff the order does
        run = shoal_django.dispatch("fulfil", {"order": order.id},
                                    idempotency_key=f"order-{order.id}")
        if item == "out of stock":
            raise ValueError("no such item")   # rolls back the order and the run
    return JsonResponse({"order": order.id, "run": run.id}, status=201)


@require_GET
def order(request: HttpRequest, order_id: int) -> JsonResponse:
    found = Order.objects.get(id=order_id)
    return JsonResponse({"order": found.id, "item": found.item, "status": found.status})


@require_GET
def run_status(request: HttpRequest, run_id: str) -> JsonResponse:
    try:
        run = shoal_django.client().get_run(run_id)
    except shoal.UnknownRunError:
        return JsonResponse({"error": f"no run {run_id}"}, status=404)
    return JsonResponse({"run": run.id, "status": run.status.value, "output": run.output})
