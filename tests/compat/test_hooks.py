"""After-import hooks and one-time wrapping: how every CPU patch reaches a host module."""

from __future__ import annotations

import functools
import sys
import types

from openrlhf_dppo.compat.cpu.hooks import after_import, once


def test_after_import_patches_a_module_on_first_import_only(tmp_path, monkeypatch):
    (tmp_path / "e5_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "e5_probe_mod", raising=False)
    seen = []
    after_import("e5_probe_mod", lambda m: seen.append(m.VALUE))
    assert seen == []  # not imported eagerly
    import e5_probe_mod  # noqa: F401

    assert seen == [1]
    after_import("e5_probe_mod", lambda m: seen.append(m.VALUE + 1))  # already imported: runs now
    assert seen == [1, 2]


def test_once_wraps_a_method_a_single_time_even_through_functools_wraps():
    ns = types.SimpleNamespace(f=lambda x: x)

    def add(k):
        def factory(original):
            @functools.wraps(original)
            def wrapped(x):
                return original(x) + k

            return wrapped

        return factory

    once(ns, "f", add(1))
    once(ns, "f", add(10))  # a second patch of the same method is skipped
    assert ns.f(0) == 1
