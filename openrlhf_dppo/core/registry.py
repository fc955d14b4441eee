"""A tiny name -> function registry, used only on the axes that really vary (keep-probability policy,
sampling design, packer). A second registration of a taken name is refused; an unknown name raises a
``ValueError`` that lists the valid ones.

A name whose implementation lives above core (the ``openrlhf`` packer wraps OpenRLHF's own
partitioning, and core never imports the host) is *declared* here with the module that provides it:
the name is valid at once (``DPPOConfig(packer="openrlhf")`` needs no import order), and the provider
fills it in with the usual ``register`` when it is imported. Core never imports the provider itself.

Every entry carries a one-line ``help``: the config field's help text, the ``--help`` of its flag, the
README's flag table and ``docs/DESIGN.md`` list the entries from here (``describe()``), so a new entry
is documented where it is written.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
    """Maps a name to a callable. ``kind`` is only used in error messages."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Callable] = {}
        self._providers: dict[str, str] = {}  # declared name -> module that registers it
        self._help: dict[str, str] = {}  # name -> one line: what the entry does

    def declare(self, name: str, provider: str, help: str = "") -> None:
        """Make ``name`` valid now; its implementation is registered when module ``provider`` is
        imported (by the code that runs it). Raises ``ValueError`` if the name is taken."""
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._providers[name] = provider
        self._help[name] = help

    def add(self, name: str, fn: Callable, help: str = "") -> None:
        """Register ``fn`` under ``name``. Raises ``ValueError`` if the name is taken (a declared name
        may be registered once, by anyone: the declaration only reserves it)."""
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
        self._items[name] = fn
        self._help[name] = help or self._help.get(name, "")

    def register(self, name: str, help: str = "") -> Callable[[F], F]:
        """Decorator form of ``add``: ``@REG.register("name", help="...")``."""

        def deco(fn: F) -> F:
            self.add(name, fn, help)
            return fn

        return deco

    def add_modules(self, package: str, path) -> None:
        """Register every module of a policy folder: each public module of ``package`` (``path``: its
        ``__path__``), in name order, gives ``NAME``, ``keep_probs`` and ``HELP``."""
        for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
            if not info.name.startswith("_"):
                module = importlib.import_module(f"{package}.{info.name}")
                self.add(module.NAME, module.keep_probs, module.HELP)

    def help(self, name: str) -> str:
        """The one-line description of ``name`` ("" when none was given)."""
        if name not in self:
            self.get(name)  # raises the error that lists the valid names
        return self._help.get(name, "")

    def describe(self) -> str:
        """``name1 (help1); name2 (help2)`` over every valid name: the text help and docs show."""
        return "; ".join(f"{n} ({self.help(n)})" if self.help(n) else n for n in self.names())

    def get(self, name: str) -> Callable:
        if name in self._items:
            return self._items[name]
        if name in self._providers:
            raise ValueError(
                f"{self.kind} {name!r} is implemented in {self._providers[name]}, which has not been "
                f"imported in this process; import it first (the training entry point and the adapters do)"
            )
        raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}")

    def names(self) -> list[str]:
        """Every valid name, registered or declared, sorted."""
        return sorted(set(self._items) | set(self._providers))

    def registered(self) -> list[str]:
        """The names with an implementation in this process (declared names only once provided), sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items or name in self._providers

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
