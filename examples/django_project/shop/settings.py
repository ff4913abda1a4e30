"""Settings of the example shop. The database comes from SHOP_DATABASE: a SQLite file path
(default db.sqlite3 here) or a postgresql:// URL; SHOP_SCHEMA puts Django's tables in a schema
of their own on PostgreSQL (the tests use one per test)."""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "an example, not a secret"
DEBUG = True
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "shop.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "shoal.integrations.django",     # manage.py shoal_worker, shoal_migrate
    "orders",
]

database = os.environ.get("SHOP_DATABASE", str(BASE_DIR / "db.sqlite3"))
if database.startswith(("postgresql:", "postgres:")):
    url = urlsplit(database)
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.postgresql",   # psycopg 3
        "NAME": url.path.lstrip("/"), "USER": unquote(url.username or ""),
        "PASSWORD": unquote(url.password or ""), "HOST": url.hostname or "",
        "PORT": url.port or "",
        # kept connections (SHOP_CONN_MAX_AGE seconds; 0: one per request or step), checked
        # before their first use in a request or a step: one the server dropped is replaced
        "CONN_MAX_AGE": int(os.environ.get("SHOP_CONN_MAX_AGE", "0")),
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": ({"options": f"-c search_path={os.environ['SHOP_SCHEMA']}"}
                    if os.environ.get("SHOP_SCHEMA") else {}),
    }}
else:
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3", "NAME": database,
        # the write lock at BEGIN: a transaction that reads first and writes later cannot
        # fail "database is locked" when another process (a worker) wrote meanwhile
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }}

SHOAL = {
    "NAMESPACE": "shop",
    "APP": "orders.workflows:app",                        # what shoal_worker serves
    "SCHEMA": os.environ.get("SHOP_SHOAL_SCHEMA", "shoal"),  # the store's schema (PostgreSQL)
    # no "STORE": the store lives in DATABASES["default"], so that dispatch() inside
    # transaction.atomic() writes the run in that transaction
}
