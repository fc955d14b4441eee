"""research/ is not part of the installed package: the package never imports it, setup.py does not
install it, and each study runs from the repository root as ``python -m research.<name>``."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUDIES = sorted(p.stem for p in (REPO / "research").glob("*.py") if p.stem not in ("__init__", "common"))


def test_the_package_never_imports_research():
    found = []
    for path in sorted((REPO / "openrlhf_dppo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.split(".")[0] == "research"]
    assert not found, found


def test_setup_installs_only_the_package():
    from setuptools import find_packages

    packages = find_packages(where=str(REPO), include=["openrlhf_dppo", "openrlhf_dppo.*"])
    assert "openrlhf_dppo.report" in packages
    assert not [p for p in packages if not p.startswith("openrlhf_dppo")]
    assert 'include=["openrlhf_dppo", "openrlhf_dppo.*"]' in (REPO / "setup.py").read_text()


@pytest.mark.parametrize("study", STUDIES)
def test_each_study_runs_from_the_repository_root(study):
    res = subprocess.run(
        [sys.executable, "-m", f"research.{study}", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith(f"usage: python -m research.{study}")
