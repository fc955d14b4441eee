"""The run-directory analyses moved from benchmarks/ into the report layer keep their old commands:
``python benchmarks/<name>.py`` is a thin entry point that runs the package's own ``main``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MOVED = {
    "lossless_limit": "openrlhf_dppo.report.lossless",
    "heldout_at_time": "openrlhf_dppo.report.at_time",
    "curve_noise": "openrlhf_dppo.report.curve_noise",
    "prompt_predictability": "openrlhf_dppo.report.predictability",
}


@pytest.mark.parametrize("script", sorted(MOVED))
def test_the_old_benchmark_command_runs_the_package_module(script):
    path = REPO / "benchmarks" / f"{script}.py"
    text = path.read_text()
    assert f"from {MOVED[script]} import main" in text and len(text.splitlines()) < 20  # a shim, no code
    res = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith(f"usage: benchmarks/{script}.py")
