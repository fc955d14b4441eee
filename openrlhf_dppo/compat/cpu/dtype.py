"""The patches that let the CPU pipeline run in the precision ``openrlhf_dppo.precision`` chose (why:
``patches.PATCHES``). The precision comes from ``OPENRLHF_DPPO_CPU_PRECISION`` (set by ``apply``).
"""

from __future__ import annotations

import functools
import os

from openrlhf_dppo import precision
from openrlhf_dppo.compat.cpu.hooks import after_import, once
from openrlhf_dppo.compat.cpu.weight_sync import override_engine_kwargs


def patch_fp32_param_dtype() -> None:
    """``openrlhf.utils.utils.convert_to_torch_dtype("fp32")`` -> ``torch.float32`` (the module attribute:
    model builds import it at call time)."""

    def patch(module):
        def factory(original):
            @functools.wraps(original)
            def convert_to_torch_dtype(param_dtype):
                import torch

                return torch.float32 if param_dtype == "fp32" else original(param_dtype)

            return convert_to_torch_dtype

        once(module, "convert_to_torch_dtype", factory)

    after_import("openrlhf.utils.utils", patch)


def patch_engine_dtype() -> None:
    """Driver: every vLLM engine gets the run's precision instead of ``dtype="bfloat16"``; without one in
    the environment (``apply()`` without ``precision``) OpenRLHF's bfloat16 stays."""
    value = os.environ.get(precision.ENV, "")
    if value in precision.TORCH_DTYPES:
        override_engine_kwargs(dtype=precision.TORCH_DTYPES[value])
