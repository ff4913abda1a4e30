"""What the integrations' worker commands share: the App named ``module:attribute``."""

from __future__ import annotations

import importlib

from shoal.app import App
from shoal.errors import ConfigurationError


def load_app(spec: str, where: str) -> App:
    """The :class:`shoal.App` at ``module:attribute`` (attribute default ``app``), or what a
    function there returns when called without arguments (a factory that reads the framework's
    configuration); ConfigurationError, naming ``where`` the spec came from, when it is not
    one."""
    module_name, _, attribute = spec.partition(":")
    if not module_name:
        raise ConfigurationError(f"{where} is 'module:attribute' of your shoal.App, e.g. "
                                 f"'orders.workflows:app', not {spec!r}.")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigurationError(f"{where}: cannot import {module_name!r} (no module named "
                                     f"{e.name!r}).") from None
        raise
    found: object = module
    for part in (attribute or "app").split("."):
        found = getattr(found, part, None)
    if callable(found) and not isinstance(found, (App, type)):
        found = found()
    if not isinstance(found, App):
        raise ConfigurationError(f"{where}: {spec} is {found!r:.80}, not a shoal.App.")
    return found
