"""``manage.py shoal_migrate``: create the shoal store of settings.SHOAL, or bring its schema
up to date, and print its version."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from shoal.integrations._commands import migrate, one_line
from shoal.integrations.django import settings
from shoal.stores import mask_url


class Command(BaseCommand):  # type: ignore[misc]
    help = "Create or upgrade the shoal store of settings.SHOAL; print its schema version."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            s = settings()
            version = migrate(s.namespace, s.store)
        except ImproperlyConfigured as e:
            raise CommandError(str(e)) from None
        except Exception as e:
            line = one_line(e)
            if line is None:
                raise
            raise CommandError(line) from None
        self.stdout.write(f"{mask_url(s.store)} is at schema version {version}.")
