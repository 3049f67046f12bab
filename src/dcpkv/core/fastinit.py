"""A faster ``__init__`` for frozen, slotted dataclasses built on a hot path.

Theory of operation
-------------------
A frozen dataclass's generated ``__init__`` stores each field with ``object.__setattr__``,
which looks the attribute up anew for every field: for a ten-field event that is most of the
cost of a DCP consumer's per-item work (about 2.5 µs against 0.3 µs for a plain class).
Storing through the slots' descriptors (``slot.__set__``) halves that, but each store is still
a call.

:func:`fast_init` gives the class a *mutable twin*: a plain class with the very same slots
(same names, same order, same base ``object``), so CPython lets an instance change its
``__class__`` between the two. The new ``__init__`` (same signature) turns the fresh instance
into the twin, stores the fields with ordinary attribute stores (the interpreter's fastest),
and turns it back, about half the cost of the descriptor calls. The class stays frozen
(assignment still raises), hashable and comparable: only construction changes, and
``__post_init__`` still runs, on the finished frozen instance.

:func:`fast_builder` goes one step further for a trusted internal path that already holds
valid fields (the client builds an event and an offset per delivered change): a plain function
of the fields, in field order, that makes a twin, stores them and sets ``__class__``, with no
``__init__`` call and no ``__post_init__`` (its checks are the caller's promise), about half
the cost of the fast ``__init__`` again.

Limits (checked): slots, base ``object``, and fields that are plain positional-or-keyword
parameters with at most a plain default (no ``default_factory``, no ``kw_only``, no
``InitVar``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_TWIN = "_fast_init_twin"


def fast_init(cls: type[T]) -> type[T]:
    """Give ``cls`` (a frozen, slotted dataclass) the fast ``__init__``; returns ``cls``."""
    twin = _make_twin(cls)
    params, body = [], ["    _become(self, '__class__', _twin)"]
    namespace: dict[str, Any] = {"_twin": twin, "_cls": cls, "_become": object.__setattr__}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.default_factory is not dataclasses.MISSING or f.kw_only or not f.init:
            raise TypeError(f"{cls.__name__}.{f.name}: fast_init takes plain fields only")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
        body.append(f"    self.{f.name} = {f.name}")
    body.append("    self.__class__ = _cls")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body)
    # Generated the way dataclasses generates its own __init__: a signature per class.
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    setattr(cls, _TWIN, twin)
    return cls


def fast_builder(cls: type[T]) -> Callable[..., T]:
    """A constructor of a :func:`fast_init` class without ``__init__`` or ``__post_init__``:
    positional fields in field order, all required (module docstring). Only for callers that
    already hold valid fields."""
    twin = cls.__dict__.get(_TWIN)
    if twin is None:
        raise TypeError(f"{cls.__name__} is not a fast_init class")
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    body = ["    o = _twin()", *(f"    o.{n} = {n}" for n in names), "    o.__class__ = _cls"]
    source = f"def build({', '.join(names)}):\n" + "\n".join([*body, "    return o"])
    namespace: dict[str, Any] = {"_twin": twin, "_cls": cls}
    exec(source, namespace)
    build = namespace["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build


def _make_twin(cls: type) -> type:
    slots = cls.__dict__.get("__slots__")
    if slots is None or not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a slotted dataclass")
    if cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__}: fast_init takes classes based on object only")
    twin = type(f"_Mutable{cls.__name__}", (), {"__slots__": tuple(slots)})
    try:  # CPython's own check that the layouts match (the same slots, in the same order)
        probe: Any = object.__new__(twin)
        probe.__class__ = cls
    except TypeError as exc:
        raise TypeError(f"{cls.__name__}: no mutable twin ({exc})") from None
    return twin
