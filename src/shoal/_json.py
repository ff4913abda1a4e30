"""JSON values only: checked before anything is stored, so no pickle ever reaches a store."""

from __future__ import annotations

import json
import math
from typing import Any

JSON = Any  # a JSON value: dict[str, JSON] | list[JSON] | str | int | float | bool | None


def check_json(value: object, what: str) -> None:
    """Raise ``TypeError`` naming the first path in ``value`` that is not a JSON value."""
    _walk(value, what)


def _walk(value: object, path: str) -> None:
    if value is None or isinstance(value, (str, bool, int)):
        return
    if isinstance(value, float):
        if math.isfinite(value):
            return
        raise TypeError(f"{path} is {value!r}: JSON has no NaN or infinity")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{path} has a key {key!r} of type {type(key).__name__}: "
                                f"JSON object keys must be str")
            _walk(item, f"{path}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _walk(item, f"{path}[{i}]")
        return
    raise TypeError(f"{path} is a {type(value).__name__} ({value!r:.60}), not a JSON value "
                    f"(dict, list, str, int, float, bool, None)")


def dumps(value: JSON) -> str:
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)
