"""Core stays pure: its modules import only the standard library, torch, numpy, core itself and the
constants of ``openrlhf_dppo.metric_keys``, and importing it loads none of the host stack."""

import ast
import subprocess
import sys
from pathlib import Path

import openrlhf_dppo.core as core

ALLOWED = {"torch", "numpy", "openrlhf_dppo"}
OWN = ("openrlhf_dppo.core", "openrlhf_dppo.metric_keys")  # the package modules core may import
FORBIDDEN = ("ray", "deepspeed", "vllm", "openrlhf", "transformers")


def test_core_sources_import_only_torch_numpy_stdlib():
    for path in Path(core.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "openrlhf_dppo":
                    assert name.startswith(OWN), f"{path.name} imports {name}"
                else:
                    assert top in ALLOWED or top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_importing_core_loads_no_host_module():
    code = (
        "import sys, openrlhf_dppo.core; "
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_public_names_exported():
    for name in core.__all__:
        assert hasattr(core, name), name
