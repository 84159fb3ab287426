"""One generic registry: every extension point of the project is a `Registry` of named things.

A thing registers beside its definition, by decorator or by one call, and every reader looks it up by name:

    OPTIMIZERS = Registry("optimizer", key="config.optimizer.name")

    @OPTIMIZERS.register("adamw")
    def adamw(config, schedule): ...

    OPTIMIZERS.get(config.name)      # the thing, or one line naming the known choices
    OPTIMIZERS.names()               # for validation and --help

A registration may also be a "module:attribute" string, imported on first lookup: a table can then name code
that costs a JAX import (or lives in a module that imports the table) without importing it. Capabilities are
attributes of what is registered; readers never compare its name. This module imports nothing of the project,
so every layer may use it.
"""
from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")
# A "module:attr" registration (`package.module:Class.attribute`); any other string is a value, kept as it is
# (a config file's "configs/bert.py:size=base" among them).
MODULE_ATTR = re.compile(r"^[a-z_][\w.]*:[A-Za-z_][\w.]*$")


def resolve(name: str) -> Any:
    """'package.module:attribute' (or 'module:Class.attribute') -> the attribute, its module imported on demand."""
    module, _, attributes = name.partition(":")
    found = importlib.import_module(module)
    for attribute in attributes.split("."):
        found = getattr(found, attribute)
    return found


def _imported(thing: Any) -> Any:
    """A "module:attr" registration -> what it names; any other thing as it is."""
    return resolve(thing) if isinstance(thing, str) and MODULE_ATTR.match(thing) else thing


class Registry(Generic[T]):
    """Named things of one kind, in registration order.

    what: how messages name one thing ("optimizer"); key: the config key that chooses one, if any
    ("config.optimizer.name"); error: the exception an unknown name raises (a layer's own error class, so that
    the entry points turn it into one line); fallback: a thing (or "module:attr") that answers every unregistered
    name (GLUE's tasks, which take their download spellings too: the thing then says when a name is unknown)."""

    def __init__(self, what: str, key: str | None = None, error: type[Exception] = ValueError,
                 fallback: T | str | None = None):
        self.what, self.key, self.error, self.fallback = what, key, error, fallback
        self._entries: dict[str, T | str] = {}

    def register(self, name: str, thing: T | str | None = None) -> Any:
        """register(name, thing) -> thing; register(name) -> a decorator that registers what it decorates."""
        if thing is None:
            return lambda decorated: self.register(name, decorated)
        if name in self._entries:
            raise ValueError(f"{self.what} {name!r} is registered twice")
        self._entries[name] = thing
        return thing

    def get(self, name: str) -> T:
        """The thing registered as `name` (a string registration imported now), the fallback for an unregistered
        name, or `error` naming the choices."""
        if name in self._entries:
            thing = self._entries[name] = _imported(self._entries[name])
            return thing
        if self.fallback is not None:
            self.fallback = _imported(self.fallback)
            return self.fallback
        where = f"{self.key}={name!r}" if self.key else f"{self.what} {name!r}"
        raise self.error(f"{where} is unknown; available: {', '.join(map(repr, self.names()))}")

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, thing) for every registration, string registrations imported."""
        return ((name, self.get(name)) for name in self.names())

    def find(self, accepts: Callable[[T], bool]) -> list[tuple[str, T]]:
        """The (name, thing) pairs whose thing `accepts`: a lookup by capability, never by name."""
        return [(name, thing) for name, thing in self.items() if accepts(thing)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def registered(self, name: str, thing: T | str) -> Iterator[T | str]:
        """`thing` registered as `name` for the body of a `with` (tests, notebooks), then unregistered."""
        self.register(name, thing)
        try:
            yield thing
        finally:
            del self._entries[name]

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self.names())})"
