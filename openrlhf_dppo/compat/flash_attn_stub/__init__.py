"""A pure-torch stand-in (no attention kernels) for the two flash-attn modules OpenRLHF 0.11.2 imports at
module level (``flash_attn.bert_padding``, ``flash_attn.utils.distributed``).
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
    """Put the stand-in at the end of ``sys.path`` and ``PYTHONPATH`` when no real flash_attn is found;
    returns True when the stand-in is (now) what ``flash_attn`` resolves to. Idempotent."""
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
