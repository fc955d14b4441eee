"""Subclassing Ray actor classes, and scoped swaps of host module globals.

``@ray.remote`` turns a class into an ``ActorClass`` that cannot be subclassed. Ray 2.55 keeps the
decorated Python class at ``ActorClass.__ray_metadata__.modified_class.__ray_actor_class__`` and the
decorator's options at ``ActorClass._default_options``; ``remote_like`` wraps a subclass with the same
options again.
"""

from __future__ import annotations

import contextlib

import ray


def unwrap_actor_class(actor_class) -> type:
    """The Python class behind a ``@ray.remote`` class (or the class itself if it is not one)."""
    meta = getattr(actor_class, "__ray_metadata__", None)
    if meta is None:
        return actor_class
    modified = meta.modified_class
    return getattr(modified, "__ray_actor_class__", modified)


def remote_like(actor_class, subclass: type):
    """``ray.remote`` applied to ``subclass`` with the options ``actor_class`` was declared with."""
    options = dict(getattr(actor_class, "_default_options", None) or {})
    return ray.remote(**options)(subclass) if options else ray.remote(subclass)


@contextlib.contextmanager
def swap_attr(obj, name: str, value):
    """Set ``obj.name = value`` for the duration of the block, then restore the previous value (an
    instance attribute that only shadowed its class's attribute, e.g. a method, is removed again)."""
    previous = getattr(obj, name)
    owned = name in getattr(obj, "__dict__", {})
    setattr(obj, name, value)
    try:
        yield previous
    finally:
        if owned:
            setattr(obj, name, previous)
        else:
            delattr(obj, name)
