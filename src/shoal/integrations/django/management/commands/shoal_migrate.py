"""``manage.py shoal_migrate``: create the shoal store of settings.SHOAL, or bring its schema
up to date, and print its version."""

from __future__ import annotations

import asyncio
from typing import Any

from django.core.management.base import BaseCommand

from shoal.app import App
from shoal.integrations.django import settings
from shoal.stores import mask_url


class Command(BaseCommand):  # type: ignore[misc]
    help = "Create or upgrade the shoal store of settings.SHOAL; print its schema version."

    def handle(self, *args: Any, **options: Any) -> None:
        s = settings()

        async def migrate() -> int:
            app = App(s.namespace, store=s.store)
            async with app.open():   # opening migrates
                return await app.store.migrate()

        version = asyncio.run(migrate())
        self.stdout.write(f"{mask_url(s.store)} is at schema version {version}.")
