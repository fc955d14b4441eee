"""The patches that let the CPU pipeline run in the precision ``openrlhf_dppo.precision`` chose.

OpenRLHF 0.11.2 assumes bf16 (or fp16) in two places the CPU path must change: its dtype table knows no
fp32, and it builds every vLLM engine in bfloat16 whatever ``--ds.param_dtype`` says. The weight sync
then follows by itself: the trainer broadcasts each parameter in its own dtype and the engine's
``update_weight`` asserts that dtype is the engine's. The run's precision reaches these installers
through ``OPENRLHF_DPPO_CPU_PRECISION``, which ``apply(precision=...)`` sets to the resolved
``--ds.param_dtype`` (and Ray hands to every worker).
"""

from __future__ import annotations

import functools
import os

from openrlhf_dppo import precision
from openrlhf_dppo.compat.cpu.hooks import after_import, once
from openrlhf_dppo.compat.cpu.weight_sync import override_engine_kwargs


def patch_fp32_param_dtype() -> None:
    """``convert_to_torch_dtype("fp32")`` -> ``torch.float32`` (OpenRLHF's table has bf16 and fp16 only).

    Call sites: ``Actor.__init__`` and ``get_llm_for_sequence_regression`` import it from
    ``openrlhf.utils.utils`` inside the function, at each model build (actor, reference, critic), so
    the module attribute is the one to replace. DeepSpeed's config needs nothing: with
    ``param_dtype="fp32"`` both its bf16 and fp16 sections are off, which is fp32 training.
    """

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
    """``create_vllm_engines`` passes ``dtype="bfloat16"``: the engine gets the run's precision instead.

    Driver side, through the same ``RolloutRayActor`` stand-in that hands vLLM our worker extension.
    Without a resolved precision in the environment (``apply()`` without ``precision``) OpenRLHF's
    bfloat16 stays.
    """
    value = os.environ.get(precision.ENV, "")
    if value in precision.TORCH_DTYPES:
        override_engine_kwargs(dtype=precision.TORCH_DTYPES[value])
