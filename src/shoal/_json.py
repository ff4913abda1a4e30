"""JSON values only: checked before anything is stored, so no pickle ever reaches a store."""

from __future__ import annotations

import copy as _copy
import json
import math
from collections.abc import Callable
from typing import Any

JSON = Any  # a JSON value: dict[str, JSON] | list[JSON] | str | int | float | bool | None

# Lists and objects nest at most this deep: deeper values would overflow the recursion of
# Python's json module (in a store, or when read back) instead of being refused up front.
MAX_DEPTH = 256

# App(max_payload_bytes=…) by default: the JSON text of one value (an input, a step's result…)
MAX_PAYLOAD_BYTES = 1 << 20

# a path below the value being checked: (the parent's path, the key or index), built only as
# deep as the walk goes and spelled out only for an error
_Path = tuple[Any, ...]


def check_json(value: object, what: str) -> None:
    """Raise ``TypeError`` naming the first path in ``value`` that is not a JSON value, or
    saying that ``value`` nests lists and objects deeper than ``MAX_DEPTH``."""
    stack: list[tuple[object, _Path, int]] = [(value, (), 0)]
    while stack:
        item, path, depth = stack.pop()
        if item is None or isinstance(item, (str, bool, int)):
            continue
        if isinstance(item, float):
            if math.isfinite(item):
                continue
            raise TypeError(f"{_spell(what, path)} is {item!r}: JSON has no NaN or infinity")
        if not isinstance(item, (dict, list, tuple)):
            raise TypeError(f"{_spell(what, path)} is a {type(item).__name__} ({item!r:.60}), "
                            f"not a JSON value (dict, list, str, int, float, bool, None)")
        if depth >= MAX_DEPTH:
            raise TypeError(f"{what} nests lists and objects more than {MAX_DEPTH} deep (or "
                            f"holds itself): a JSON value here is at most {MAX_DEPTH} levels "
                            f"deep")
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise TypeError(f"{_spell(what, path)} has a key {key!r} of type "
                                    f"{type(key).__name__}: JSON object keys must be str")
            children = [(v, (path, k), depth + 1) for k, v in item.items()]
        else:
            children = [(v, (path, i), depth + 1) for i, v in enumerate(item)]
        stack.extend(reversed(children))   # depth first, in order: the first bad path is named


def _spell(what: str, path: _Path) -> str:
    keys: list[Any] = []
    while path:
        path, key = path
        keys.append(key)
    return what + "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in reversed(keys))


def checked(value: object, what: str, max_bytes: int | None = None) -> JSON:
    """``value`` as every store gives it back (a JSON round trip: a tuple becomes a list),
    after :func:`check_json`. Raises ``ValueError`` when its JSON text is longer than
    ``max_bytes`` (the text is ASCII: its length is its size in bytes)."""
    return checked_size(value, what, max_bytes)[0]


def checked_size(value: object, what: str, max_bytes: int | None = None) -> tuple[JSON, int]:
    """:func:`checked`, and the size of the value's JSON text in bytes."""
    return checked_text(value, what, max_bytes)[:2]


def checked_text(value: object, what: str, max_bytes: int | None = None
                 ) -> tuple[JSON, int, str]:
    """:func:`checked_size`, and the value's JSON text (as :func:`dumps` writes it)."""
    copy, text = _round_trip(value)
    if text is None:
        check_json(value, what)   # raises for every value the round trip did not take back
        text = dumps(value)
        copy = json.loads(text)
    if max_bytes is not None and len(text) > max_bytes:
        raise ValueError(f"{what} is {len(text)} bytes of JSON, over the limit of {max_bytes} "
                         f"bytes (App(max_payload_bytes=…)): keep large data elsewhere (a "
                         f"file, an object store) and pass a reference to it")
    return copy, len(text), text


def _round_trip(value: object) -> tuple[JSON, str | None]:
    """The fast path of :func:`checked_text`, in C: ``value`` encoded and decoded again, with
    its text, when the copy equals ``value`` and the text cannot nest deeper than
    ``MAX_DEPTH`` (it has no more brackets than that): then :func:`check_json` would pass.
    ``(None, None)`` for anything else (a type JSON has not, NaN, a key that is not a str, a
    tuple, a deep or circular value): the caller checks it the slow way, which names the path."""
    try:
        text = _ENCODER.encode(value)
    except (TypeError, ValueError, RecursionError):
        return None, None
    if text.count("[") + text.count("{") > MAX_DEPTH:
        return None, None
    copy = decode(text)
    return (copy, text) if copy == value else (None, None)


def copy(value: JSON) -> JSON:
    """A copy of a JSON value as the SQL stores give it back (a tuple becomes a list)."""
    return json.loads(dumps(value))


def clone(value: Any) -> Any:
    """A deep copy of a JSON value (dicts, lists, tuples of JSON scalars), for a caller to change
    as it likes: about three times as fast as ``copy.deepcopy``, which keeps a memo for cycles a
    JSON value cannot have. Anything else is left to ``copy.deepcopy``."""
    kind = type(value)
    if kind is dict:
        return {k: clone(v) for k, v in value.items()}
    if kind is list:
        return [clone(v) for v in value]
    if kind in _SCALARS:
        return value
    if kind is tuple:
        return tuple(clone(v) for v in value)
    return _copy.deepcopy(value)


_SCALARS = frozenset({str, int, float, bool, type(None)})


# one encoder for every call: json.dumps with options builds a new one each time (0.6 us of
# the 2.3 us of a small value)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dumps(value: JSON) -> str:
    """The compact JSON text of ``value`` (non-ASCII escaped; NaN and infinity refused)."""
    return _ENCODER.encode(value)


def loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


# the C scanner json.loads ends in (typeshed does not declare the attribute)
_SCAN: Callable[[str, int], tuple[JSON, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def decode(text: str) -> JSON:
    """The value of a text :func:`dumps` wrote: ``json.loads`` without its checks for the
    whitespace and extra data such a text has not (its C scanner alone, 0.4 us less)."""
    return _SCAN(text, 0)[0]
