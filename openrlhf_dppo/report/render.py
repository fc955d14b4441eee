"""Rendering a :class:`Report`: rich tables for the terminal, report.md + PNG plots for ``--out``."""

from __future__ import annotations

import os
from pathlib import Path

from openrlhf_dppo.report.headline import headline
from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.tables import all_tables, summary_table

METHOD_NOTES = """\
## How the numbers are computed
- **Arms** are configurations; their runs are the seeds. Runs are grouped by their run_config.json
  (equal but for `train.seed` / `dppo.seed` and per-run paths) or named with `--arm NAME=GLOB`.
  Every number per arm is the mean over its seeds, with the spread: ± sample standard deviation and
  (min–max). A difference between two arms no larger than the larger of their standard deviations is
  called "within the seed spread"; with one seed per arm no spread is available.
- **Training time** is the time axis: `time/train_s`, the sum of `timing/step_total` from the first
  step on (older runs: the cumulative `timing/step_total`). Start-up (`time/startup_s`, process start
  to the first step) and evaluation (`timing/eval`) are reported on their own and are in no time axis,
  so a start-up difference cannot make a speedup.
- **Held-out accuracy** is `eval_<dataset>_pass1` ({heldout}) on the eval prompts. Each run's curve is
  replaced by its running median over {window} neighbouring eval points, centred; where a centred window
  would start before the first point there is no smoothed value (a window moved forward would let the
  first point show later evals), and at the end the window is the last {window} points (it looks back
  only). A single noisy evaluation can neither lift the curve over the target nor set the final value.
  **Final accuracy** = the smoothed value at the last eval point: the median of the last {window} evals
  (their steps and the last reading are in the summary). The SE of one eval point is
  sqrt(p (1 - p) / n), n = eval prompts x samples (per prompt at temperature 0).
- **Time to target** = the first training time at which the smoothed curve reaches the target,
  interpolated linearly between eval points; per arm on the mean curve over seeds (mean accuracy and
  mean training time at each eval step all seeds share); a seed that never reaches it is counted
  ("k of n"), never dropped; a curve at the target from its first smoothed point has no crossing, only
  a bound (warned for every arm). Target: {target} ({target_source}).
- **Matched-accuracy ratio** = an arm's training time to the target / the baseline's (below 1: faster).
- **Vs the same budget, chosen at random** = a DPPO arm's training time to the target / that of its
  control, an arm that spends its budget at random (`openrlhf_dppo/report/controls.py`): uniform
  selection (`--dppo.prompt_policy uniform`, its flags otherwise) or GRPO at DPPO's budget (GRPO with a
  `--rollout.batch_size` within 10% of the arm's mean rolled-out prompts per step, the nearest of
  several); "no control run" where the report has none.
- **Step-time speedup** = mean over the baseline's seeds of the median `timing/step_total` / the same
  for the arm (medians over the steps after the first {warmup} warm-up step(s)).
- **Ideal speedup** = 1 / (g (f + (1 - f)(1 - r_o))), the limit of pruning alone
  (`openrlhf_dppo/report/speedup.py`, item 3: 1 - r_q there is the rollout a step does; packing
  gains come on top).
  f = median `timing/generation` / median `timing/step_total` of the baseline; g = the arm's mean
  `samples/generated` per step / the baseline's (1 - r_q where not logged; above 1 for an arm that rolls
  out more than the baseline, as dynamic filtering does); r_q = 1 - mean `dppo/prompt_keep_frac`,
  r_o = 1 - mean `dppo/completion_keep_frac` of the arm after warm-up (configured rates shown as `cfg`);
  where that is not logged, 1 - `samples/trained` / `samples/generated`: for GRPO + dynamic filtering the
  fraction of generated completions its filter dropped (`tokens/filtered`), which the work table marks
  "filtered, not pruned".
- **Lossless limit** = 1 / (sum_i T_i (1 - u_i) / sum_i T_i) over the baseline's steps after warm-up,
  mean over its seeds: u_i = `rollout/equal_reward_frac_ht`, the share of step i's groups whose rewards
  are all equal (advantage 0 under a group estimator, no policy gradient), T_i = `timing/step_total`.
  Skipping only those groups leaves the baseline's gradient exactly as it was; an arm whose steps are
  faster than this trains on fewer gradient-carrying groups a step, and whether that costs accuracy per
  step depends on the task (the held-out curves by step say). "—" where the baseline does not log it.
- **Training reward**: `rollout/reward_ht` where logged (the Horvitz-Thompson estimate of the drawn
  batch's mean reward; GRPO's equals its `rollout/reward_mean`), else `rollout/reward_mean`; trailing
  mean over {smooth} steps. It is no held-out measure: the headline does not use it.
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


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(report: Report, plots: dict[str, Path] | None = None) -> str:
    lines = ["# openrlhf-dppo compare", ""]
    for arm in report.arms:
        runs = ", ".join(f"`{s.run.name}` ({s.run.path})" for s in arm.members)
        lines.append(f"- arm `{arm.name}`{' (baseline)' if arm is report.baseline else ''}: {runs}")
    lines.append("")
    summary = headline(report)
    if summary:
        lines += ["## Summary", ""] + [f"- {_md_cell(line)}" for line in summary] + [""]
    if report.warnings:
        lines += ["## Warnings", ""] + [f"- {_md_cell(w)}" for w in report.warnings] + [""]
    for title, headers, rows in all_tables(report):
        lines += [f"## {title}", "", "| " + " | ".join(headers) + " |"]
        lines.append("|" + "|".join("---" for _ in headers) + "|")
        lines += ["| " + " | ".join(_md_cell(cell) for cell in row) + " |" for row in rows] + [""]
    for c in report.comparisons:
        if c.differences:
            lines += [f"### Config differences: `{c.other.name}` vs `{report.baseline.name}`", ""]
            lines += ["| category | key | baseline | arm |", "|---|---|---|---|"]
            lines += [
                f"| {d.category} | `{d.key}` | {_md_cell(repr(d.baseline))} | {_md_cell(repr(d.other))} |"
                for d in c.differences
            ] + [""]
    lines.append(
        METHOD_NOTES.format(
            warmup=report.settings.warmup,
            smooth=report.settings.smooth,
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
