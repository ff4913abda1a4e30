"""The example shop on Flask: an app factory with the shoal extension, orders kept in a plain
sqlite3 database that is also the shoal store, so that an order and its run are written in one
transaction. Run it with ``flask --app shop run`` and the worker with ``flask --app shop shoal
worker`` (SHOP_DATABASE names the file; default shop.db)."""

import os
import sqlite3
from typing import Any

from flask import Flask, g, jsonify, request

import shoal
from shoal.integrations.flask import Shoal

shoal_ext = Shoal()


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    database = os.environ.get("SHOP_DATABASE", "shop.db")
    app.config.update(
        DATABASE=database,
        SHOAL_STORE=f"sqlite:///{database}",     # the same file: one transaction for both
        SHOAL_NAMESPACE="shop",
        SHOAL_WORKER_APP="shop.workflows:make_worker",   # for 'flask shoal worker'
    )
    app.config.update(config or {})
    shoal_ext.init_app(app)
    app.teardown_appcontext(_close_db)

    @app.post("/orders")
    def place_order() -> Any:
        db = _db()
        item = request.get_json()["item"]
        with db:   # one transaction: the order and its run, or neither
            order = db.execute("INSERT INTO orders (item) VALUES (?)", (item,)).lastrowid
            run = shoal_ext.client.dispatch("fulfil", {"order": order}, connection=db)
            if item == "out of stock":
                raise ValueError("no such item")
        return jsonify(order=order, run=run.id), 201

    @app.get("/runs/<run_id>")
    def run_status(run_id: str) -> Any:
        try:
            run = shoal_ext.client.get_run(run_id)
        except shoal.UnknownRunError:
            return jsonify(error=f"no run {run_id}"), 404
        return jsonify(run=run.id, status=run.status.value, output=run.output)

    return app


def _db() -> sqlite3.Connection:
    if "db" not in g:
        from flask import current_app

        g.db = sqlite3.connect(current_app.config["DATABASE"], timeout=20)
        g.db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT)")
    db: sqlite3.Connection = g.db
    return db


def _close_db(error: BaseException | None) -> None:
    db = g.pop("db", None)
    if db is not None:
        db.close()
