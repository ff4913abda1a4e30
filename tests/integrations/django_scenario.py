"""Run by test_django.py in a process of its own (Django's settings are per process), in the
example project (examples/django_project) with the database the test chose and a worker
(manage.py shoal_worker) serving it. Exits 0 when every check holds."""

import django

django.setup()

import sqlite3  # noqa: E402

import psycopg  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from orders.models import Order  # noqa: E402

import shoal  # noqa: E402
from shoal.integrations import django as shoal_django  # noqa: E402

web = Client(raise_request_exception=False)

# a placed order: the run was written in the view's transaction, and the worker ships it
placed = web.post("/orders", {"item": "kettle"}, content_type="application/json")
assert placed.status_code == 201, placed.content[:300]
body = placed.json()
output = shoal_django.client().result(body["run"], timeout=30)
assert output == {"order": body["order"], "parcel": f"parcel-{body['order']}"}, output
assert web.get(f"/orders/{body['order']}").json()["status"] == "shipped"
status = web.get(f"/runs/{body['run']}").json()
assert status["status"] == "succeeded" and status["output"] == output, status
assert web.get("/runs/nope").status_code == 404

# a view that fails after dispatching: neither the order nor its run exists
failed = web.post("/orders", {"item": "out of stock"}, content_type="application/json")
assert failed.status_code == 500
assert not Order.objects.filter(item="out of stock").exists()
runs = shoal_django.client().list_runs(workflow="fulfil")
assert [r.input for r in runs] == [{"order": body["order"]}], runs

# Django's own connection is what dispatch joins: a rollback takes the run with it
with transaction.atomic():
    raw = shoal_django.connection()
    assert isinstance(raw, (sqlite3.Connection, psycopg.Connection)), raw
    sid = transaction.savepoint()
    run = shoal_django.dispatch("fulfil", {"order": -1})
    transaction.savepoint_rollback(sid)
try:
    shoal_django.client().get_run(run.id)
    raise AssertionError("the run rolled back with its savepoint is there")
except shoal.UnknownRunError:
    pass
# outside atomic(): committed at once
alone = shoal_django.dispatch_many("fulfil", [{"order": -2}], delay=3600)
assert shoal_django.client().get_run(alone[0].id).status == shoal.RunStatus.QUEUED
shoal_django.client().cancel(alone[0].id)
assert connection.in_atomic_block is False

# settings: checked with a message; a change of SHOAL gets a new client
before = shoal_django.client()
with override_settings(SHOAL={"NAMESPACE": "other"}):
    assert shoal_django.client() is not before
    assert shoal_django.client().namespace == "other"
    assert shoal_django.settings().store == shoal_django.store_url()
for bad, says in (({"NAMESPACES": "x"}, "NAMESPACES"), ({"OPTIONS": {"lease": 3}}, "'lease'"),
                  ({"DATABASE": "nope"}, "nope"), ({"NAMESPACE": ""}, "NAMESPACE"), ([], "dict"),
                  ({"STORE": "mysql://x"}, "Unknown store URL 'mysql://x'")):
    with override_settings(SHOAL=bad):
        try:
            shoal_django.settings()
            raise AssertionError(f"{bad!r} was taken")
        except ImproperlyConfigured as e:
            assert "SHOAL" in str(e) and says in str(e), e
# every option of the Client (docs/clients.md); make_app() takes those an App takes
every = {"max_queued": 100, "admission": "park", "version": "v2", "max_payload_bytes": 1 << 20,
         "migrate": False, "clock": shoal.SystemClock(), "tracing": True, "close_timeout": 5.0}
with override_settings(SHOAL={"NAMESPACE": "shop", "OPTIONS": every}):
    assert shoal_django.settings().options == every
    assert shoal_django.client().close_timeout == 5.0
    worker = shoal_django.make_app()
    assert worker.tracing is not None and worker.max_queued == 100 and worker.version == "v2"
print("scenario ok")
