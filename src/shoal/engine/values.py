"""Typed values at the JSON boundary. A store keeps JSON only; a workflow's input and output and
a step's result may also be a pydantic model or a dataclass, which the annotation of the
workflow's ``input`` parameter, of its return type, or of the step function's return type names.
shoal stores such a value's JSON and gives a value of the annotated type back.

- a pydantic model ``M`` (``shoal[pydantic]``): dumped with ``model_dump(mode="json")``, loaded
  with ``M.model_validate`` (a bad value raises ``ValueError`` naming each field);
- a dataclass ``D`` (no extra needed): dumped with ``dataclasses.asdict``, loaded by
  ``D(**fields)``, nested dataclasses, models, lists and dicts of them included (a missing or
  unknown field raises ``ValueError`` naming it; the field values are not checked);
- ``X | None``, ``list[X]`` and ``dict[str, X]`` of those.

Any other annotation, or none, means a JSON value, as it is. A model or dataclass returned where
no annotation names its type is refused with a ``TypeError`` that says which annotation to add:
a replay, which has only the JSON, could not give the same value back."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
import types
import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shoal import _json

# annotations that mean a JSON value as it is: no codec, no resolution of the annotation
_PLAIN = frozenset({"str", "int", "float", "bool", "dict", "list", "None", "Any", "object",
                    "typing.Any", "JSON"})
_PLAIN_TYPES: frozenset[object] = frozenset({str, int, float, bool, dict, list, None, type(None),
                                             Any, object})


def _pydantic_model(tp: object) -> bool:
    """Whether ``tp`` is a pydantic model class (pydantic is imported already when it is)."""
    pydantic = sys.modules.get("pydantic")
    return (pydantic is not None and isinstance(tp, type)
            and issubclass(tp, pydantic.BaseModel))


def _model_errors(e: Exception) -> str:
    """A pydantic ``ValidationError`` in one line: each field's path and what is wrong."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return str(e)
    parts = []
    for err in errors():
        where = ".".join(str(p) for p in err.get("loc", ())) or "(the value)"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


class Codec:
    """How values of one annotated type cross the JSON boundary."""

    name: str = "value"

    def dump(self, value: Any, what: str) -> Any:
        """``value`` (of the type, or JSON that loads as one) as JSON; ``ValueError`` or
        ``TypeError`` naming ``what`` and the field when it is not one."""
        raise NotImplementedError

    def load(self, value: Any, what: str) -> Any:
        """The value of the type that ``value`` (JSON) holds; ``ValueError`` naming ``what``
        and the field when it does not hold one."""
        raise NotImplementedError


class _Model(Codec):
    def __init__(self, model: type[Any]) -> None:
        self.model = model
        self.name = model.__name__

    def dump(self, value: Any, what: str) -> Any:
        typed = value if isinstance(value, self.model) else self.load(value, what)
        return typed.model_dump(mode="json")

    def load(self, value: Any, what: str) -> Any:
        try:
            return self.model.model_validate(value)
        except ValueError as e:   # pydantic's ValidationError is one
            raise ValueError(f"{what} is not a valid {self.name}: {_model_errors(e)}") from None


class _Dataclass(Codec):
    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.name = cls.__name__

    @functools.cached_property
    def _codecs(self) -> dict[str, Codec | None]:
        """The codec of each field's annotation."""
        hints = _hints(self.cls)
        return {f.name: codec_for(hints.get(f.name, Any)) for f in dataclasses.fields(self.cls)}

    @functools.cached_property
    def _fields(self) -> list[tuple[str, Codec | None, bool]]:
        """Each init field: its name, the codec of its annotation, whether it is required."""
        return [(f.name, self._codecs[f.name],
                 f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                for f in dataclasses.fields(self.cls) if f.init]

    def dump(self, value: Any, what: str) -> Any:
        if not isinstance(value, self.cls):
            value = self.load(value, what)
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            codec = self._codecs.get(f.name)
            out[f.name] = (codec.dump(item, f"{what}.{f.name}") if codec is not None
                           else _plain(item))
        return out

    def load(self, value: Any, what: str) -> Any:
        if isinstance(value, self.cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{what} is not a valid {self.name}: a JSON object of its fields "
                             f"is expected, not {value!r:.60}")
        known = {name for name, _, _ in self._fields}
        for key in value:
            if key not in known:
                raise ValueError(f"{what} is not a valid {self.name}: unexpected field {key!r} "
                                 f"(its fields: {', '.join(sorted(known))})")
        args = {}
        for name, codec, required in self._fields:
            if name not in value:
                if required:
                    raise ValueError(f"{what} is not a valid {self.name}: field {name!r} is "
                                     f"missing")
                continue
            item = value[name]
            args[name] = codec.load(item, f"{what}.{name}") if codec is not None else item
        return self.cls(**args)


def plain(value: Any) -> Any:
    """``value`` with every dataclass and pydantic model in it dumped to JSON (where no
    annotation says what to load it as: a workflow another instance registered)."""
    return _plain(value)


def _plain(value: Any) -> Any:
    """A field without a codec of its own: a dataclass or model in it is dumped all the same
    (``dataclasses.asdict`` would have recursed into it), the rest is left as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Dataclass(type(value)).dump(value, type(value).__name__)
    if _pydantic_model(type(value)):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


class _Optional(Codec):
    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.name = f"{inner.name} | None"

    def dump(self, value: Any, what: str) -> Any:
        return None if value is None else self.inner.dump(value, what)

    def load(self, value: Any, what: str) -> Any:
        return None if value is None else self.inner.load(value, what)


class _List(Codec):
    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.name = f"list[{inner.name}]"

    def dump(self, value: Any, what: str) -> Any:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise TypeError(f"{what} is a {type(value).__name__}, not a list of "
                            f"{self.inner.name}")
        return [self.inner.dump(v, f"{what}[{i}]") for i, v in enumerate(value)]

    def load(self, value: Any, what: str) -> Any:
        if not isinstance(value, list):
            raise ValueError(f"{what} is not a valid {self.name}: a JSON list is expected, "
                             f"not {value!r:.60}")
        return [self.inner.load(v, f"{what}[{i}]") for i, v in enumerate(value)]


class _Dict(Codec):
    def __init__(self, inner: Codec) -> None:
        self.inner = inner
        self.name = f"dict[str, {inner.name}]"

    def dump(self, value: Any, what: str) -> Any:
        if not isinstance(value, Mapping):
            raise TypeError(f"{what} is a {type(value).__name__}, not a {self.name}")
        return {k: self.inner.dump(v, f"{what}[{k!r}]") for k, v in value.items()}

    def load(self, value: Any, what: str) -> Any:
        if not isinstance(value, dict):
            raise ValueError(f"{what} is not a valid {self.name}: a JSON object is expected, "
                             f"not {value!r:.60}")
        return {k: self.inner.load(v, f"{what}[{k!r}]") for k, v in value.items()}


def _hints(cls: type[Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:   # one that does not resolve: the others one by one, it stays plain JSON
        module = sys.modules.get(cls.__module__)
        namespace = dict(vars(module)) if module is not None else {}
        return {name: _evaluate(raw, namespace) if isinstance(raw, str) else raw
                for name, raw in getattr(cls, "__annotations__", {}).items()}


@functools.lru_cache(maxsize=1024)
def _codec_for(annotation: Any) -> Codec | None:
    if annotation in _PLAIN_TYPES:
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _codec_for(args[0])
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            inner = _codec_for(rest[0])
            return None if inner is None else _Optional(inner)
        return None
    if origin in (list, Sequence, typing.Sequence) and len(args) == 1:
        inner = _codec_for(args[0])
        return None if inner is None else _List(inner)
    if origin in (dict, Mapping, typing.Mapping) and len(args) == 2 and args[0] is str:
        inner = _codec_for(args[1])
        return None if inner is None else _Dict(inner)
    if _pydantic_model(annotation):
        return _Model(annotation)
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return _Dataclass(annotation)
    return None


def codec_for(annotation: Any) -> Codec | None:
    """The codec of a (resolved) annotation; None for a plain JSON value."""
    try:
        return _codec_for(annotation)
    except TypeError:   # not hashable: no type shoal converts
        return None


def _function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations describe calling ``fn`` (a partial's, a method's)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__func__", fn)


_RETURNS: weakref.WeakKeyDictionary[Callable[..., Any], Codec | None] = (
    weakref.WeakKeyDictionary())


def returned(fn: Callable[..., Any]) -> Codec | None:
    """The codec of what ``fn`` returns, from its return annotation (None: plain JSON)."""
    f = _function(fn)
    annotations = getattr(f, "__annotations__", None)
    if not annotations or "return" not in annotations:
        return None
    raw = annotations["return"]
    if isinstance(raw, str) and raw in _PLAIN:
        return None
    try:
        return _RETURNS[f]
    except (KeyError, TypeError):
        pass
    codec = codec_for(_resolve(f, "return", raw))
    with contextlib.suppress(TypeError):   # not weakly referable: resolved again next time
        _RETURNS[f] = codec
    return codec


def _resolve(fn: Callable[..., Any], name: str, raw: Any) -> Any:
    """The annotation ``name`` of ``fn``, a string one evaluated in the function's globals;
    ``Any`` when it does not resolve (a class defined in a function under
    ``from __future__ import annotations``)."""
    if not isinstance(raw, str):
        return raw
    try:
        return typing.get_type_hints(fn).get(name, Any)
    except Exception:   # another annotation does not resolve (a TYPE_CHECKING import): this one
        return _evaluate(raw, getattr(fn, "__globals__", {}))


def _evaluate(annotation: str, namespace: dict[str, Any]) -> Any:
    """A string annotation evaluated in ``namespace``, as ``get_type_hints`` does; ``Any``
    when it does not resolve."""
    try:
        return eval(annotation, dict(namespace))
    except Exception:
        return Any


class WorkflowTypes:
    """The codecs of a workflow function's input (its second parameter) and output (its return
    type), resolved on first use (a model named in a string annotation may be defined after the
    function is decorated)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    @functools.cached_property
    def input(self) -> Codec | None:
        try:
            params = list(inspect.signature(self._fn).parameters.values())
        except (TypeError, ValueError):
            return None
        if len(params) < 2 or params[1].annotation is inspect.Parameter.empty:
            return None
        return codec_for(_resolve(self._fn, params[1].name, params[1].annotation))

    @functools.cached_property
    def output(self) -> Codec | None:
        return returned(self._fn)


def typed_instance(value: object) -> str | None:
    """``"a pydantic model"`` or ``"a dataclass"`` when ``value`` is one, else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "a dataclass"
    if _pydantic_model(type(value)):
        return "a pydantic model"
    return None


def dump(codec: Codec | None, value: Any, what: str, annotate: str) -> Any:
    """``value`` as JSON for the store: through ``codec``, or as it is without one. A model or
    dataclass without a codec is refused with a ``TypeError`` saying to annotate ``annotate``."""
    if codec is not None:
        return codec.dump(value, what)
    kind = typed_instance(value)
    if kind is not None:
        name = type(value).__name__
        raise TypeError(
            f"{what} is a {name} ({kind}), but no annotation names its type: annotate "
            f"{annotate} as {name} (or {name} | None), so that shoal stores its JSON and gives "
            f"a {name} back, on a replay too.")
    return value


def load(codec: Codec | None, value: Any, what: str) -> Any:
    """The stored JSON ``value`` as the caller gets it: through ``codec``, else a copy of it
    to change as it likes."""
    if codec is not None:
        return codec.load(value, what)
    return _json.clone(value)
