"""The compare report and advise: read run directories, group them into arms, compare the arms, render
tables, markdown and plots. Imports neither the host nor torch (advise's projection imports
``openrlhf_dppo.core``); matplotlib and rich only when plots or the terminal table are made."""

from openrlhf_dppo.report.arms import build_report
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.run import RunDirError, load_run
from openrlhf_dppo.report.summary import Settings

__all__ = ["Report", "RunDirError", "Settings", "build_report", "load_run"]
