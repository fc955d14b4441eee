"""Moved: the analysis lives in the package, ``openrlhf_dppo.report.lossless`` (``python -m
openrlhf_dppo.report.lossless --help``; ``openrlhf-dppo advise`` reports it per run). This thin
entry point keeps ``python benchmarks/lossless_limit.py ...`` (benchmarks/RESULTS.md's commands) working.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from openrlhf_dppo.report.lossless import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:], prog="benchmarks/lossless_limit.py")
