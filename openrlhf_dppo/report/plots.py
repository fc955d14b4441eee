"""PNG plots of the compare report, drawn on matplotlib's Agg canvas (no display, no pyplot state).

``build_figures(report)`` returns the curves by name (held-out accuracy, training reward), each only where
a run logged it; ``write_plots`` saves them, each PNG's number of axes in its text metadata under
``AXES_KEY``. The phases, tokens and eval results are report.md's tables; the per-step ``dppo/*``
metrics are the training loggers' to plot.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from openrlhf_dppo.report.model import Report
from openrlhf_dppo.report.summary import REWARD_WINDOW

AXES_KEY = "openrlhf_dppo.axes"


def _figure(n_axes: int, width: float = 6.0) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * n_axes, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, n_axes, i + 1) for i in range(n_axes)]


def _color(i: int) -> str:
    return f"C{i % 10}"


def _arm_colors(report: Report) -> dict[str, str]:
    """A colour per arm, shared by its seeds and kept across figures."""
    return {arm.name: _color(i) for i, arm in enumerate(report.arms)}


def _heldout(report: Report) -> Figure | None:
    """Held-out accuracy against training time and step: each seed thin (its measured points), the
    arm's mean smoothed curve bold, the target dashed, the arm's time to target dotted."""
    if not any(arm.curve for arm in report.arms):
        return None
    fig, (by_time, by_step) = _figure(2)
    colors = _arm_colors(report)
    for arm in report.arms:
        color = colors[arm.name]
        for s in arm.members:
            if s.heldout is not None:
                by_time.plot(s.heldout.times, s.heldout.raw, color=color, alpha=0.35, lw=0.8, marker=".")
                by_step.plot(s.heldout.steps, s.heldout.raw, color=color, alpha=0.35, lw=0.8, marker=".")
        if arm.curve is not None:
            label = f"{arm.name} (mean of {len(arm.seed_curves)})"
            smoothed = [math.nan if v is None else v for v in arm.curve.smoothed]  # no value: a gap
            by_time.plot(arm.curve.times, smoothed, color=color, lw=2.5, label=label)
            by_step.plot(arm.curve.steps, smoothed, color=color, lw=2.5, label=label)
        if arm.ttt is not None:
            by_time.axvline(arm.ttt, color=color, ls=":", lw=1)
    for ax, xlabel in ((by_time, "training time (s, start-up and eval excluded)"), (by_step, "step")):
        if report.target is not None:
            ax.axhline(report.target, color="grey", ls="--", lw=1, label="target")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"held-out pass@1 ({report.heldout})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_time.set_title("held-out accuracy vs training time (thin: seeds, bold: arm mean)")
    by_step.set_title(
        f"held-out accuracy vs step (bold: mean of running medians of {report.settings.eval_window})"
    )
    return fig


def _reward(report: Report) -> Figure | None:
    if not any(s.reward_raw for s in report.summaries):
        return None
    fig, (by_time, by_step) = _figure(2)
    colors = _arm_colors(report)
    k = REWARD_WINDOW
    for s in report.summaries:
        color, label = colors[s.arm], s.run.name
        by_time.plot(s.reward_times, s.reward_raw, color=color, alpha=0.2, lw=1)
        by_time.plot(s.reward_times, s.reward_smoothed, color=color, lw=1.5, label=label)
        by_step.plot(s.reward_steps, s.reward_raw, color=color, alpha=0.2, lw=1)
        by_step.plot(s.reward_steps, s.reward_smoothed, color=color, lw=1.5, label=label)
    keys = sorted({s.reward_key for s in report.summaries if s.reward_raw})
    for ax, xlabel in ((by_time, "training time (s)"), (by_step, "step")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{' / '.join(keys)} (faint: per step, solid: mean of last {k})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
    by_time.set_title("training reward vs training time")
    by_step.set_title("training reward vs step")
    return fig


BUILDERS = {"heldout": _heldout, "reward": _reward}


def build_figures(report: Report) -> dict[str, Figure]:
    figures = {}
    for name, builder in BUILDERS.items():
        fig = builder(report)
        if fig is not None:
            figures[name] = fig
    return figures


def write_plots(report: Report, out_dir: str | Path) -> dict[str, Path]:
    """Save every figure as ``out_dir/<name>.png``; returns {name: path}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, fig in build_figures(report).items():
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100, metadata={AXES_KEY: str(len(fig.axes)), "Title": name})
        paths[name] = path
    return paths
