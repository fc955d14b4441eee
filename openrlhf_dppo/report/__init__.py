"""The compare report: read run directories, group them into arms (a configuration, one or more
seeds), compare the arms on held-out accuracy against training time and on step time, render tables,
markdown and plots.

Layering: this package reads files written by the trainer (``openrlhf_dppo.run_dir``) and imports
neither the host (OpenRLHF, Ray, DeepSpeed, vLLM) nor torch; matplotlib is imported only when plots are
written and rich only when the terminal table is printed.
"""

from openrlhf_dppo.report.arms import build_report, group_runs
from openrlhf_dppo.report.comparability import Difference, config_differences
from openrlhf_dppo.report.curves import Curve, Spread
from openrlhf_dppo.report.model import Arm, Comparison, Report
from openrlhf_dppo.report.run import Run, RunDirError, load_run
from openrlhf_dppo.report.summary import RunSummary, Settings

__all__ = [
    "Arm",
    "Comparison",
    "Curve",
    "Difference",
    "Report",
    "Run",
    "RunDirError",
    "RunSummary",
    "Settings",
    "Spread",
    "build_report",
    "config_differences",
    "group_runs",
    "load_run",
]
