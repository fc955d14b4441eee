"""How the CPU patches are put in: the environment names, after-import hooks (host modules are patched
right after their first import, never imported eagerly), one-time wrapping, and the log line.
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Callable

ENV_DISABLE = "OPENRLHF_DPPO_CPU_DISABLE"  # comma-separated patch names to leave out
ENV_ACTIVE = "OPENRLHF_DPPO_CPU"  # "1" inside Ray workers started by apply()
ENV_VERIFY = "OPENRLHF_DPPO_VERIFY_SYNC"  # path of a JSONL file: one record per weight sync
ENV_HEARTBEAT = "OPENRLHF_DPPO_HEARTBEAT"  # file touched by workers on progress (watchdog input)
ENV_SYNC_TIMEOUT = "OPENRLHF_DPPO_SYNC_TIMEOUT_S"  # gloo collective timeout (default 600 s)
ENV_WATCHDOG = "OPENRLHF_DPPO_WATCHDOG_S"  # seconds without progress before the run is ended (600)
ENV_DEVICE = "OPENRLHF_DPPO_DEVICE"  # auto (default) | cpu | cuda: where the workers compute


def log(msg: str) -> None:
    print(f"[openrlhf-dppo cpu] {msg}", file=sys.stderr, flush=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs callbacks on a module right after its first import (so workers never import eagerly)."""

    def __init__(self):
        self.callbacks: dict[str, list[Callable]] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_patch(module, _exec=exec_module, _name=fullname):
                    _exec(module)
                    for cb in self.callbacks.pop(_name, []):
                        cb(module)

                spec.loader.exec_module = exec_then_patch
                return spec
        return None


_AFTER_IMPORT = _AfterImport()


def after_import(module_name: str, callback: Callable) -> None:
    """Call ``callback(module)`` now if ``module_name`` is imported, else right after its import."""
    if module_name in sys.modules:
        callback(sys.modules[module_name])
        return
    if _AFTER_IMPORT not in sys.meta_path:
        sys.meta_path.insert(0, _AFTER_IMPORT)
    _AFTER_IMPORT.callbacks.setdefault(module_name, []).append(callback)


def once(obj, attr: str, wrapper_factory: Callable) -> None:
    """Replace ``obj.attr`` by ``wrapper_factory(original)`` unless a wrapper (marked, and the mark travels
    with ``functools.wraps``) is already there: the first wrapper on a method is the only one."""
    original = getattr(obj, attr)
    if getattr(original, "_openrlhf_dppo_cpu", False):
        return
    wrapped = wrapper_factory(original)
    wrapped._openrlhf_dppo_cpu = True
    setattr(obj, attr, wrapped)
