"""Moved: the analysis lives in the package, ``openrlhf_dppo.report.curve_noise`` (``python -m
openrlhf_dppo.report.curve_noise --help``, the arms of ``openrlhf-dppo compare``). This thin
entry point keeps ``python benchmarks/curve_noise.py ...`` (benchmarks/RESULTS.md's commands) working.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openrlhf_dppo.report.curve_noise import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:], prog="benchmarks/curve_noise.py")
