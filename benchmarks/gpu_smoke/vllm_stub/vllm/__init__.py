"""Import stand-in for vLLM, used by ``benchmarks/gpu_smoke.sh`` only.

``openrlhf.trainer.ray`` imports its vLLM engine module, which imports ``vllm`` (``vllm.inputs.
TokensPrompt``, ``vllm.utils.random_uuid``) at module level, so even the actor trainer, which never
talks to an engine in the smoke, needs ``import vllm`` to work. vLLM cannot be carried to the smoke's
machine (far above its wheel budget). Any ``vllm.<name>`` other than the two submodules raises an
AttributeError that names this stand-in; the smoke script puts ``benchmarks/gpu_smoke/vllm_stub`` on
PYTHONPATH only when ``import vllm`` fails there.
"""

STAND_IN = "benchmarks/gpu_smoke/vllm_stub"


def __getattr__(name: str):
    raise AttributeError(
        f"vllm.{name} is not in the GPU smoke's vLLM stand-in ({STAND_IN}/vllm): this code path needs "
        "the real vLLM, which the smoke does not run"
    )
