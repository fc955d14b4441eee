"""``vllm.utils`` of the GPU smoke's vLLM stand-in: the one name OpenRLHF imports."""


def random_uuid() -> str:
    raise RuntimeError("vllm stand-in: random_uuid() belongs to an engine request; needs the real vLLM")
