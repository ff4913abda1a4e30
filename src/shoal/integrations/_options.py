"""What the web-framework integrations share about the Client's options: which there are, and
a clear error for one that is not."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from shoal.app import Client
from shoal.errors import ConfigurationError

# shoal.Client's keyword options (docs/clients.md), read from its signature so that a new one
# is taken here too; the store and the namespace have settings of their own
CLIENT_OPTIONS = tuple(name for name, p in inspect.signature(Client).parameters.items()
                       if p.kind is p.KEYWORD_ONLY and name != "namespace")


def client_options(given: object, where: str) -> dict[str, Any]:
    """``given`` (a mapping of the Client's options, from ``where`` in the framework's
    settings) as a dict; ConfigurationError naming the unknown options and the known ones."""
    if not isinstance(given, Mapping):
        raise ConfigurationError(f"{where} is a dict of shoal.Client options "
                                 f"({', '.join(CLIENT_OPTIONS)}), not {given!r:.80}.")
    unknown = sorted(str(k) for k in given if k not in CLIENT_OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"{where} has unknown option{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))}; shoal.Client takes {', '.join(CLIENT_OPTIONS)}.")
    return dict(given)
