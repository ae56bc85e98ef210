"""One generic registry of named things with metadata, and the registry of gates built on it.

Duplicate names fail at registration; a miss says "did you mean ...? Available: ..."; third-party
gates register through the entry-point group `servegate.gates` (the entry point names a Gate class,
or a module whose import registers its gates).
"""

from __future__ import annotations

import difflib
import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from servegate.contracts.diff import GATE_WATCHES
from servegate.contracts.errors import ServegateError

if TYPE_CHECKING:
    from servegate.gates.base import Gate

T = TypeVar("T")

ENTRY_POINT_GROUP = "servegate.gates"


class RegistryError(ServegateError):
    """A name registered twice, or looked up but not registered."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    """A registered object with its name and metadata."""

    name: str
    obj: T
    metadata: dict[str, Any] = field(default_factory=dict)


class Registry(Generic[T]):
    """Names -> objects with metadata; entry points of `group` are loaded on first lookup."""

    def __init__(self, kind: str, group: str | None = None) -> None:
        self.kind = kind
        self.group = group
        self._entries: dict[str, Entry[T]] = {}
        self._entry_points_loaded = group is None

    def register(self, name: str, **metadata: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object under `name` with `metadata`."""

        def decorate(obj: T) -> T:
            self.add(name, obj, **metadata)
            return obj

        return decorate

    def add(self, name: str, obj: T, **metadata: Any) -> None:
        """Register `obj` under `name`; a name already taken raises RegistryError."""
        if not name:
            raise RegistryError(f"a {self.kind} needs a non-empty name")
        if name in self._entries:
            raise RegistryError(f"{self.kind} {name!r} is already registered by {self._entries[name].obj!r}")
        self._entries[name] = Entry(name, obj, dict(metadata))

    def remove(self, name: str) -> None:
        """Unregister `name` (tests and plugins that replace their own entry)."""
        self._entries.pop(name, None)

    def entry(self, name: str) -> Entry[T]:
        """The entry for `name`; a miss raises RegistryError naming the closest names and all available."""
        self.load_entry_points()
        if name not in self._entries:
            names = sorted(self._entries)
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise RegistryError(f"unknown {self.kind} {name!r}; {hint}Available: {', '.join(names) or '(none)'}")
        return self._entries[name]

    def get(self, name: str) -> T:
        """The object registered under `name`."""
        return self.entry(name).obj

    def __contains__(self, name: object) -> bool:
        self.load_entry_points()
        return name in self._entries

    def names(self) -> list[str]:
        """Registered names in registration order."""
        self.load_entry_points()
        return list(self._entries)

    def __iter__(self) -> Iterator[Entry[T]]:
        self.load_entry_points()
        return iter(list(self._entries.values()))

    def load_entry_points(self) -> None:
        """Import third-party plugins of this registry's entry-point group (once)."""
        if self._entry_points_loaded or self.group is None:
            return
        self._entry_points_loaded = True
        for point in importlib.metadata.entry_points(group=self.group):
            try:
                loaded = point.load()
            except Exception as exc:  # a broken plugin must not take the built-in gates down with it
                raise RegistryError(f"{self.kind} plugin {point.name!r} ({point.value}) failed to load: {exc}") from exc
            if isinstance(loaded, type) and point.name not in self._entries:
                register_class(self, point.name, loaded)


def register_class(registry: Registry[Any], name: str, cls: type) -> None:
    """Register a class with the metadata it declares as class attributes (`watches`, `purpose`)."""
    registry.add(name, cls, watches=tuple(getattr(cls, "watches", ())), purpose=getattr(cls, "purpose", ""))


GATES: Registry[type[Gate]] = Registry("gate", group=ENTRY_POINT_GROUP)
"""Every gate `gate check` can run: built-in ones and those of installed plugins."""


def gate_watches() -> dict[str, tuple[str, ...]]:
    """The trigger table `gate check` and `gate diff` use: the built-in gates' (GATE_WATCHES, in the order
    they run), then every other registered gate's own watches (plugins)."""
    return {**GATE_WATCHES, **{entry.name: tuple(entry.metadata.get("watches", ())) for entry in GATES}}


def register_gate(
    name: str, *, watches: tuple[str, ...], purpose: str, beside_others: bool = False, shares: str | None = None
) -> Callable[[type[Gate]], type[Gate]]:
    """Class decorator: register a gate with the manifest fields it watches and a one-line purpose.

    `beside_others`: its verdict does not depend on how fast the machine runs, so `gate check --jobs` may run it in
    a process beside other gates (a gate that times anything, or a third party's that does not say, runs alone).
    `shares`: gates that name the same key reuse each other's outputs (the evaluation baseline's suite runs), so
    they run in one process.
    """

    def decorate(cls: type[Gate]) -> type[Gate]:
        cls.name = name
        cls.watches = watches
        cls.purpose = purpose
        GATES.add(name, cls, watches=watches, purpose=purpose, beside_others=beside_others, shares=shares)
        return cls

    return decorate
