"""A pure-torch stand-in for the two flash-attn modules OpenRLHF 0.11.2 imports at module level
(``flash_attn.bert_padding``, ``flash_attn.utils.distributed``), which cannot be built without CUDA.

``install()`` puts the directory holding our ``flash_attn`` package at the END of ``sys.path``, and only
when no real ``flash_attn`` can be found, so an installed flash-attn always wins. It has no attention
kernels (``flash_attention_2`` still fails; on CPU we use sdpa).
"""

from __future__ import annotations

import importlib.util
import os
import sys

STUB_PATH = os.path.dirname(os.path.abspath(__file__))


def real_flash_attn_available() -> bool:
    """True when an importable flash_attn exists that is not our stand-in."""
    spec = importlib.util.find_spec("flash_attn")
    if spec is None or spec.origin is None:
        return False
    return not os.path.abspath(spec.origin).startswith(STUB_PATH + os.sep)


def install() -> bool:
    """Make ``import flash_attn`` resolve to the stand-in when the real package is missing.

    Returns True when the stand-in is (now) what ``flash_attn`` resolves to. Idempotent.
    """
    if "flash_attn" in sys.modules:
        origin = getattr(sys.modules["flash_attn"], "__file__", "") or ""
        return os.path.abspath(origin).startswith(STUB_PATH + os.sep)
    if real_flash_attn_available():
        return False
    if STUB_PATH not in sys.path:
        sys.path.append(STUB_PATH)
    # Ray workers and subprocesses (vLLM engine workers) inherit the environment, not sys.path.
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if STUB_PATH not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts + [STUB_PATH])
    importlib.invalidate_caches()
    return True
