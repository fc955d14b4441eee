"""``vllm.inputs`` of the GPU smoke's vLLM stand-in: the one name OpenRLHF imports."""


class TokensPrompt(dict):
    """A name only: building a prompt for an engine fails (there is none in the smoke)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("vllm stand-in: TokensPrompt needs the real vLLM")
