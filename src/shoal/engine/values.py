"""Typed values at the JSON boundary. A store keeps JSON only; a workflow's input and output and
a step's result may also be a pydantic model or a dataclass, which the annotation of the
workflow's ``input`` parameter, of its return type, or of the step function's return type names.
shoal stores such a value's JSON and gives a value of the annotated type back.

- a pydantic model ``M`` (``shoal[pydantic]``): dumped with ``model_dump(mode="json")`` by field
  name (never by alias), loaded from its JSON text with ``M.model_validate_json`` by alias or by
  name, so that every alias configuration and a strict model round-trip. A dump is loaded back
  at once and refused where it does not give the same fields: ``ValueError`` naming each field of
  a model that is not valid (built with ``model_construct``, changed without validation),
  ``TypeError`` naming a field that does not survive its JSON (a ``SecretStr``);
- a dataclass ``D`` (no extra needed): dumped with ``dataclasses.asdict``, loaded by
  ``D(**fields)``, nested dataclasses, models, lists and dicts of them included (a missing or
  unknown field raises ``ValueError`` naming it; the field values are not checked);
- ``X | None``, ``list[X]`` and ``dict[str, X]`` of those.

Any other annotation, or none, means a JSON value, as it is. A model or dataclass returned where
no annotation names its type is refused with a ``TypeError`` that says which annotation to add:
a replay, which has only the JSON, could not give the same value back. So is one where the
annotation is a string that does not resolve (:class:`Unresolved`), saying why."""

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


@functools.cache
def _by_name() -> dict[str, bool]:
    """How a model is validated from stored JSON: by alias or by field name (pydantic 2.11
    and later), else as its configuration says."""
    import pydantic
    params = inspect.signature(pydantic.BaseModel.model_validate_json).parameters
    return {"by_alias": True, "by_name": True} if "by_name" in params else {}


def _dump_options() -> dict[str, Any]:
    # by field name where the load accepts names whatever the configuration says; an older
    # pydantic validates by alias, so it is dumped by alias (the load-back check refuses the
    # rest)
    return {"mode": "json", "round_trip": True, "warnings": False,
            "by_alias": not _by_name()}


def _validate(model: type[Any], value: Any, what: str) -> Any:
    """``value`` (JSON, or a dict a caller gave) loaded as ``model``: from its JSON text, so that
    a strict model takes the strings it dumps its dates and enums as; ``ValueError`` naming each
    field that is not valid."""
    try:
        try:
            text = _json.dumps(value)
        except (TypeError, ValueError):   # not JSON (a caller's dict holding a date): as it is
            return model.model_validate(value, **_by_name())
        return model.model_validate_json(text, **_by_name())
    except ValueError as e:   # pydantic's ValidationError is one
        raise ValueError(f"{what} is not a valid {model.__name__}: {_model_errors(e)}") from None


def _model_json(value: Any, model: type[Any], what: str) -> Any:
    """``value`` (a ``model``) as the JSON a store keeps, once it is known to load back as the
    same fields: ``ValueError`` naming each field when it is not a valid ``model``, ``TypeError``
    naming the field whose JSON gives another value back (a ``SecretStr``)."""
    try:
        data = value.model_dump(**_dump_options())
    except Exception as e:   # pydantic's PydanticSerializationError: a field without JSON
        raise TypeError(f"{what} cannot be stored as JSON: {e}") from None
    try:
        back = _validate(model, data, what)
    except ValueError:
        secret = _secret_in(value, "")   # its mask may not even be valid (a Secret[int])
        if secret is not None:
            raise TypeError(_unstorable(what, *secret, None)) from None
        raise
    changed = _difference(value, back, "")
    if changed is not None:
        raise TypeError(_unstorable(what, *changed))
    return data


_MISSING = object()


def _difference(given: Any, back: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first field where ``back`` (``given`` dumped and loaded again) differs from it, as
    (its path, its value, the value back); None when none does. The fields of ``back``'s type
    are compared (a subclass given for its base comes back as the base); a value that comes
    back as another JSON-alike type (a tuple as a list, under ``Any``) is the same."""
    if _pydantic_model(type(given)) and _pydantic_model(type(back)):
        for name in type(back).model_fields:
            found = _difference(getattr(given, name, _MISSING), getattr(back, name, None),
                                f"{path}.{name}" if path else name)
            if found is not None:
                return found
        extra = given.__pydantic_extra__ or {}, back.__pydantic_extra__ or {}
        return None if extra == ({}, {}) else _difference(*extra, path)
    if dataclasses.is_dataclass(given) and type(given) is type(back):
        for f in dataclasses.fields(given):
            found = _difference(getattr(given, f.name), getattr(back, f.name, _MISSING),
                                f"{path}.{f.name}" if path else f.name)
            if found is not None:
                return found
        return None
    if isinstance(given, (list, tuple)) and isinstance(back, (list, tuple)):
        if len(given) == len(back):
            for i, (g, b) in enumerate(zip(given, back, strict=True)):
                found = _difference(g, b, f"{path}[{i}]")
                if found is not None:
                    return found
            return None
    elif isinstance(given, dict) and isinstance(back, dict):
        if given.keys() == back.keys():
            for k in given:
                found = _difference(given[k], back[k], f"{path}[{k!r}]")
                if found is not None:
                    return found
            return None
    elif _same(given, back):
        return None
    return path or "(the value)", given, back


def _same(given: Any, back: Any) -> bool:
    try:
        if given == back or (given != given and back != back):   # NaN is NaN
            return True
    except Exception:   # a comparison that raises: not known to be the same
        return False
    if type(given) is type(back) or given is _MISSING:
        return False   # the same type, and another value: its JSON lost it (a SecretStr)
    pydantic_core = sys.modules.get("pydantic_core")
    try:   # another type (a set as a list, under Any): the same JSON is the same value
        return bool(pydantic_core is not None and pydantic_core.to_jsonable_python(given)
                    == pydantic_core.to_jsonable_python(back))
    except Exception:
        return False


def _secret_in(value: Any, path: str) -> tuple[str, Any] | None:
    """The first secret in a model: its path and itself; or None."""
    if _secret(value):
        return path or "(the value)", value
    if _pydantic_model(type(value)):
        items: Any = ((f"{path}.{k}" if path else k, getattr(value, k, None))
                      for k in type(value).model_fields)
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"{path}[{k!r}]", v) for k, v in value.items())
    else:
        return None
    return next((p for p in (_secret_in(v, at) for at, v in items) if p is not None), None)


def _secret(value: object) -> bool:
    pydantic = sys.modules.get("pydantic")
    kinds = tuple(k for k in (getattr(pydantic, n, None) for n in
                              ("SecretStr", "SecretBytes", "Secret")) if isinstance(k, type))
    return isinstance(value, kinds)


def _unstorable(what: str, path: str, given: Any, back: Any) -> str:
    """Why ``what`` is refused: its field ``path`` is ``given`` but comes back as ``back``."""
    if _secret(given):
        return (f"{what} cannot be stored: {path} is a {type(given).__name__}, which is dumped "
                f"as '**********' and could not be given back. Keep secrets out of inputs, "
                f"outputs and step results (a store keeps them in the clear): pass what "
                f"names the secret instead, and read it where it is used.")
    shown = "missing" if given is _MISSING else f"{given!r:.80}"
    return (f"{what} cannot be stored: {path} is {shown} but its JSON loads back as "
            f"{back!r:.80} (a field left out of the dump, or a serializer that loses what it "
            f"holds): give it a type whose JSON loads back as the same value.")


class _Model(Codec):
    def __init__(self, model: type[Any]) -> None:
        self.model = model
        self.name = model.__name__

    def dump(self, value: Any, what: str) -> Any:
        typed = value if isinstance(value, self.model) else self.load(value, what)
        return _model_json(typed, self.model, what)

    def load(self, value: Any, what: str) -> Any:
        if isinstance(value, self.model):   # in a dict a caller gave
            return value
        return _validate(self.model, value, what)


class _Dataclass(Codec):
    def __init__(self, cls: type[Any]) -> None:
        self.cls = cls
        self.name = cls.__name__

    @functools.cached_property
    def _codecs(self) -> dict[str, Codec | None]:
        """The codec of each field's annotation."""
        hints = _hints(self.cls)
        return {f.name: hint if isinstance(hint := hints.get(f.name, Any), Unresolved)
                else codec_for(hint) for f in dataclasses.fields(self.cls)}

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
                           else _plain(item, f"{what}.{f.name}"))
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


def plain(value: Any, what: str = "the value") -> Any:
    """``value`` with every dataclass and pydantic model in it dumped to JSON (where no
    annotation says what to load it as: a workflow another instance registered); a model that
    does not load back as itself is refused as a codec refuses it."""
    return _plain(value, what)


def _plain(value: Any, what: str) -> Any:
    """A field without a codec of its own: a dataclass or model in it is dumped all the same
    (``dataclasses.asdict`` would have recursed into it), the rest is left as it is."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _Dataclass(type(value)).dump(value, what)
    if _pydantic_model(type(value)):
        return _model_json(value, type(value), what)
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{what}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _plain(v, f"{what}[{k!r}]") for k, v in value.items()}
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
    """The annotation of each field of dataclass ``cls``; :class:`Unresolved` for a string one
    that does not resolve from its module's globals."""
    try:
        return typing.get_type_hints(cls)
    except Exception:   # one that does not resolve: the others one by one
        module = sys.modules.get(cls.__module__)
        namespace = dict(vars(module)) if module is not None else {}
        hints = {}
        for name, raw in getattr(cls, "__annotations__", {}).items():
            try:
                hints[name] = eval(raw, dict(namespace)) if isinstance(raw, str) else raw
            except Exception as e:
                hints[name] = unresolved = Unresolved(cls, raw, e)
                unresolved.annotation = (f"the annotation of field {name!r} of dataclass "
                                         f"{cls.__name__}")
        return hints


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


class Unresolved(Codec):
    """An annotation that is a string not resolving from its function's module globals: a
    class defined inside a function, or imported only under ``TYPE_CHECKING``, named under
    ``from __future__ import annotations``. Its values are JSON as they are; a model or
    dataclass is refused, saying why (no codec can give it back)."""

    def __init__(self, owner: object, raw: str, error: Exception) -> None:
        self.raw = raw
        self.module = getattr(owner, "__module__", None) or "?"
        # its function or dataclass is defined inside a function: it will never resolve
        self.local = "<locals>" in getattr(owner, "__qualname__", "")
        self.missing = getattr(error, "name", None) if isinstance(error, NameError) else None
        self.name = raw
        # what the annotation is, where no caller says: "the annotation of parameter 'order'"
        self.annotation = ""

    def why(self, annotation: str) -> str:
        """That ``annotation`` (its description) does not resolve, why, and what to do."""
        missing = f" (the name {self.missing!r} is not defined there)" if self.missing else ""
        name = self.missing or "it"
        return (f"{annotation} is the string {self.raw!r}, which cannot be resolved from the "
                f"globals of module {self.module!r}{missing}: under `from __future__ import "
                f"annotations` every annotation is a string, and a class defined inside a "
                f"function (or imported only under TYPE_CHECKING) is not among the module's "
                f"globals. Define {name} at module level (imported at run time), or drop "
                f"`from __future__ import annotations` from that module.")

    def dump(self, value: Any, what: str, annotation: str = "") -> Any:
        kind = typed_instance(value)
        if kind is not None:
            raise TypeError(f"{what} is a {type(value).__name__} ({kind}), but "
                            f"{self.why(annotation or self.annotation or 'its annotation')}")
        return value

    def load(self, value: Any, what: str) -> Any:
        return _json.clone(value)


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
    codec = _codec_of(f, "return", raw)
    with contextlib.suppress(TypeError):   # not weakly referable: resolved again next time
        _RETURNS[f] = codec
    return codec


def _codec_of(fn: Callable[..., Any], name: str, raw: Any) -> Codec | None:
    """The codec of the annotation ``name`` of ``fn``: a string one evaluated in the
    function's globals, :class:`Unresolved` when it does not resolve."""
    if not isinstance(raw, str):
        return codec_for(raw)
    try:
        return codec_for(typing.get_type_hints(fn)[name])
    except Exception:   # another annotation does not resolve (a TYPE_CHECKING import): this one
        try:
            return codec_for(eval(raw, dict(getattr(fn, "__globals__", {}))))
        except Exception as e:
            unresolved = Unresolved(fn, raw, e)
            unresolved.annotation = ("its return type" if name == "return" else
                                     f"the annotation of parameter {name!r}")
            return unresolved


class WorkflowTypes:
    """The codecs of a workflow function's input (its second parameter) and output (its return
    type), resolved on first use (a model named in a string annotation may be defined after the
    function is decorated)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    @functools.cached_property
    def _input(self) -> tuple[str, Codec | None]:
        try:
            params = list(inspect.signature(self._fn).parameters.values())
        except (TypeError, ValueError):
            return "", None
        if len(params) < 2 or params[1].annotation is inspect.Parameter.empty:
            return "", None
        return params[1].name, _codec_of(self._fn, params[1].name, params[1].annotation)

    @property
    def input(self) -> Codec | None:
        return self._input[1]

    @functools.cached_property
    def output(self) -> Codec | None:
        return returned(self._fn)

    def unresolved(self, workflow: str) -> str | None:
        """Why the input or output annotation of a workflow function defined inside another
        function does not resolve, or None. Only there is it known at registration: a
        module-level function's may name a class defined further down the module."""
        if "<locals>" not in getattr(self._fn, "__qualname__", ""):
            return None
        param, input = self._input
        for codec, annotation in ((input, f"the annotation of the input of workflow "
                                          f"{workflow!r} (parameter {param!r})"),
                                  (self.output, f"the return type of workflow {workflow!r}")):
            found = _unresolved_in(codec, set())
            if found is None or codec is None:
                continue
            if found is codec:
                return found.why(annotation)
            return f"{annotation} names {codec.name}, and {found.why(found.annotation)}"
        return None


def _unresolved_in(codec: Codec | None, seen: set[int]) -> Unresolved | None:
    """The first annotation in ``codec`` that will never resolve (its own, or a field's of a
    dataclass defined inside a function), or None."""
    if codec is None or id(codec) in seen:   # a dataclass that holds itself: seen already
        return None
    seen.add(id(codec))
    if isinstance(codec, Unresolved):
        return codec if codec.local else None
    inner = getattr(codec, "inner", None)
    if isinstance(codec, _Dataclass):
        return next((u for u in (_unresolved_in(c, seen) for c in codec._codecs.values())
                     if u is not None), None)
    return _unresolved_in(inner, seen) if isinstance(inner, Codec) else None


def typed_instance(value: object) -> str | None:
    """``"a pydantic model"`` or ``"a dataclass"`` when ``value`` is one, else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return "a dataclass"
    if _pydantic_model(type(value)):
        return "a pydantic model"
    return None


def dump(codec: Codec | None, value: Any, what: str, annotate: str) -> Any:
    """``value`` as JSON for the store: through ``codec``, or as it is without one. A model or
    dataclass without a codec is refused with a ``TypeError`` saying to annotate ``annotate``
    (or, where ``annotate`` is a string that does not resolve, why it does not)."""
    if isinstance(codec, Unresolved):
        return codec.dump(value, what, annotate)
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
