"""A tiny name -> function registry, used only on an axis that really varies (the prompt keep-probability
policy). A second registration of a taken name is refused; an unknown name raises a ``ValueError`` that
lists the valid ones.
"""

from __future__ import annotations

from typing import Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


class Registry:
    """Maps a name to a callable. ``kind`` is only used in error messages."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Callable] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@REG.register("name")``. Raises ``ValueError`` if the name is taken."""

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> Callable:
        if name not in self._items:
            raise ValueError(f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())}")
        return self._items[name]

    def names(self) -> list[str]:
        """Every registered name, in registration order."""
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
