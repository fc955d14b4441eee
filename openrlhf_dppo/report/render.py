"""Rendering a :class:`Report`: rich tables for the terminal, report.md + PNG plots for ``--out``."""

from __future__ import annotations

import os
from pathlib import Path

from openrlhf_dppo.report.headline import headline
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.summary import REWARD_WINDOW
from openrlhf_dppo.report.tables import all_tables, markdown_table, md_cell, summary_table

METHOD_NOTES = """\
## How the numbers are computed
Every rule is docs/REPORT.md's ("How the numbers are computed"). This report's settings: held-out
accuracy `eval_<dataset>_pass1` ({heldout}), each run's curve the running median over {window} eval points
(the final accuracy: the median of the last {window}); target {target} ({target_source}); step times are
medians after the first {warmup} warm-up step(s); the training reward is `rollout/reward_ht` (else
`rollout/reward_mean`), a trailing mean over {smooth} steps, in no headline.
"""


def render_terminal(report: Report, console=None, tables: bool = False) -> None:
    """The console: a summary table of about 100 columns, the warnings and the summary sentences.
    ``tables``: all of report.md's tables too (about 200 columns wide)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if console is None:  # a terminal's width, or COLUMNS; piped: 100 columns (200 with the full tables)
        console = Console()
        if not console.is_terminal and "COLUMNS" not in os.environ:
            console = Console(width=200 if tables else 100)
    shown = all_tables(report) if tables else [summary_table(report)]
    for title, headers, rows in shown:  # Text: "[2 of 3]" is ours, not rich markup
        table = Table(title=Text(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
        for i, header in enumerate(headers):  # the summary's short headers are never split mid-phrase
            width = None if tables else len(header)
            table.add_column(
                Text(header), justify="left" if i == 0 else "right", overflow="fold", min_width=width
            )
        for row in rows:
            table.add_row(*(Text(cell) for cell in row))
        console.print(table)
    for warning in report.warnings:
        console.print(Text.assemble(("warning:", "yellow"), " " + warning))
    for line in headline(report):
        console.print(Text(line, style="bold"))
    if not tables:
        console.print(
            Text(
                "The full tables (time per run and phase, work, step time against the ideal, the held-out "
                "curve per run, eval results) are in report.md (--out DIR), or here with --tables."
            )
        )


def markdown(report: Report, plots: dict[str, Path] | None = None) -> str:
    lines = ["# openrlhf-dppo compare", ""]
    for arm in report.arms:
        runs = ", ".join(f"`{s.run.name}` ({s.run.path})" for s in arm.members)
        lines.append(f"- arm `{arm.name}`{' (baseline)' if arm is report.baseline else ''}: {runs}")
    lines.append("")
    summary = headline(report)
    if summary:
        lines += ["## Summary", ""] + [f"- {md_cell(line)}" for line in summary] + [""]
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {md_cell(w)}" for w in report.warnings] + [""]
    for title, headers, rows in all_tables(report):
        lines += [f"## {title}", "", *markdown_table(headers, rows), ""]
    for c in report.comparisons:
        if c.differences:
            lines += [f"### Config differences: `{c.other.name}` vs `{report.baseline.name}`", ""]
            rows = [[d.category, f"`{d.key}`", repr(d.baseline), repr(d.other)] for d in c.differences]
            lines += [*markdown_table(["category", "key", "baseline", "arm"], rows), ""]
    lines.append(
        METHOD_NOTES.format(
            warmup=report.settings.warmup,
            smooth=REWARD_WINDOW,
            window=report.settings.eval_window,
            heldout=report.heldout or "none here",
            target="—" if report.target is None else f"{report.target:.4f}",
            target_source=report.target_source,
        )
    )
    lines.append(
        "Kept fractions read from: " + "; ".join(f"`{s.run.name}`: {s.keep_source}" for s in report.summaries)
    )
    lines.append("")
    if plots:
        lines += ["## Plots", ""] + [f"![{name}]({path.name})" for name, path in plots.items()] + [""]
    return "\n".join(lines)


def write_report(report: Report, out_dir: str | Path) -> Path:
    """Write ``out_dir/report.md`` and the PNG plots next to it; returns the report path."""
    from openrlhf_dppo.report.plots import write_plots

    out = Path(out_dir)
    plots = write_plots(report, out)
    path = out / "report.md"
    path.write_text(markdown(report, plots), encoding="utf-8")
    return path
