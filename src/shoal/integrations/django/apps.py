"""The Django app of ``shoal.integrations.django`` (add it to ``INSTALLED_APPS``)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


class ShoalConfig(AppConfig):  # type: ignore[misc]
    name = "shoal.integrations.django"
    label = "shoal"
    verbose_name = "shoal"

    def ready(self) -> None:
        setting_changed.connect(_forget_client)


def _forget_client(*, setting: str, **kwargs: Any) -> None:
    """A test's ``override_settings(SHOAL=...)`` (or of DATABASES) gets a client on the new
    settings."""
    if setting in ("SHOAL", "DATABASES"):
        from shoal.integrations.django import _reset

        _reset()
