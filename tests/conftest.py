"""Shared pytest setup. tests/ is deliberately not a package (see pyproject.toml)."""

import os

# DeepSpeed picks its accelerator at import; on CPU machines make the choice explicit and quiet.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The tests import OpenRLHF modules directly (before any adapter module would prepare the host): the
# version guard and, on CPU, the flash-attn stand-in go in first. `import openrlhf_dppo` alone does
# neither (tests/foundation checks that in a subprocess).
from openrlhf_dppo._host import prepare_host  # noqa: E402

prepare_host()
