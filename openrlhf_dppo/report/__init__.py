"""The compare report: read run directories, group them into arms (a configuration, one or more
seeds), compare the arms on held-out accuracy against training time and on step time, render tables,
markdown and plots.

Layering: this package reads files written by the trainer (``openrlhf_dppo.run_dir``) and imports
neither the host (OpenRLHF, Ray, DeepSpeed, vLLM) nor torch; matplotlib is imported only when plots are
written and rich only when the terminal table is printed.
"""

from openrlhf_dppo.report.arms import build_report
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.run import RunDirError, load_run
from openrlhf_dppo.report.summary import Settings

__all__ = ["Report", "RunDirError", "Settings", "build_report", "load_run"]
