"""The command-line tail the studies share: build compare's report from ``--arm`` specs, then a table."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.run import RunDirError


def print_analysis(
    ap: argparse.ArgumentParser,
    make_report: Callable[[], Report],
    make_table: Callable[[Report], tuple[list[dict], list[str]]],
) -> list[Any]:
    """Build the report, then the table, each error a usage error of ``ap`` (exit status 2); print the
    table's lines and the report's warnings; return the table's rows."""
    try:
        report = make_report()
    except (RunDirError, ValueError) as err:
        ap.error(str(err))
    try:
        rows, lines = make_table(report)
    except ValueError as err:
        ap.error(str(err))
    print("\n".join(lines))
    for warning in report.warnings:
        print(f"warning: {warning}")
    return rows
