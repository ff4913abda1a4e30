"""The Django app of ``shoal.integrations.django`` (add it to ``INSTALLED_APPS``)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from shoal.integrations.base import add_user_code_hooks


class ShoalConfig(AppConfig):  # type: ignore[misc]
    name = "shoal.integrations.django"
    label = "shoal"
    verbose_name = "shoal"

    def ready(self) -> None:
        from shoal.integrations.django import (
            _close_old_connections,
            _close_old_connections_async,
        )

        setting_changed.connect(_forget_client)
        checks.register(_check_settings)
        # a step is to a worker what a request is to a view: the same connection hygiene
        # around it, in the thread its ORM calls run in (an async step's sync_to_async goes to
        # asgiref's thread for sync code, and so does the hook)
        add_user_code_hooks(_close_old_connections, _close_old_connections_async)


def _forget_client(*, setting: str, **kwargs: Any) -> None:
    """A test's ``override_settings(SHOAL=...)`` (or of DATABASES) gets a client on the new
    settings."""
    if setting in ("SHOAL", "DATABASES"):
        from shoal.integrations.django import _reset

        _reset()


def _check_settings(**kwargs: Any) -> list[checks.CheckMessage]:
    """``settings.SHOAL`` checked at startup (``manage.py check``, ``runserver``, ``migrate``,
    ``shoal_worker``): one error naming what is wrong, before anything is dispatched."""
    from shoal.integrations.django import settings

    try:
        settings()
    except ImproperlyConfigured as e:
        return [checks.Error(str(e), hint="See docs/django.md, Settings.", id="shoal.E001")]
    return []
