"""Shared pytest setup and fixtures. tests/ is deliberately not a package (see pyproject.toml).

Fixtures used by more than one test folder live here; a folder's own fixtures live in its conftest.py.
"""

import os
import socket
from pathlib import Path

import pytest

# DeepSpeed picks its accelerator at import; on CPU machines make the choice explicit and quiet.
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The tests import OpenRLHF modules directly (before any adapter module would prepare the host): the
# version guard and, on CPU, the flash-attn stand-in go in first. `import openrlhf_dppo` alone does
# neither (tests/foundation checks that in a subprocess).
from openrlhf_dppo._host import prepare_host  # noqa: E402

prepare_host()

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The checkout's root directory (the one holding openrlhf_dppo/ and tests/)."""
    return REPO_ROOT


@pytest.fixture
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for gloo / TCPStore rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
