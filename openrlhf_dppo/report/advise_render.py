"""``openrlhf-dppo advise``'s output: the console text (at most ``WIDTH`` columns), advise.md and
advise.png (the share of gradient-carrying groups against the generation cost, one line per rule).
The numbers are ``report.advise``'s and ``report.recommend``'s; the console and the markdown show the same
tables (mean over runs in the console, mean ± sd (min–max) in the markdown)."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

from openrlhf_dppo.report.advise import Machine, RunAdvice
from openrlhf_dppo.report.curves import Spread
from openrlhf_dppo.report.recommend import AT_RECOMMENDED, Point, Recommendation, points
from openrlhf_dppo.report.summary import phase_label
from openrlhf_dppo.report.tables import NA, fmt, fmt_spread

WIDTH = 100
Table = tuple[str, list[str], list[list[str]]]


def _spread(values: list[float | None], spec: str, console: bool) -> str:
    sp = Spread.of(None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values)
    return fmt(sp.mean, spec) if console else fmt_spread(sp, spec)


def run_table(advice: list[RunAdvice], console: bool) -> Table:
    head = ["run", "steps", "all-equal", "1st half", "2nd half", "slope/100", "f", "lossless", "seen before"]
    rows = []
    for a in advice:
        t, rec = a.trend or {}, a.recurrence or {}
        lossless = a.lossless
        rows.append([
            a.run.name[:24], str(a.summary.steps), fmt(t.get("mean"), ".3f"), fmt(t.get("first_half"), ".3f"),
            fmt(t.get("second_half"), ".3f"), fmt(t.get("slope_per_100"), "+.3f"),
            fmt(a.summary.generation_share, ".3f"),
            NA if lossless is None else f"{lossless:.3f} ({1 / lossless:.2f}x)" if lossless > 0 else "0",
            fmt(rec.get("seen_before"), ".2f"),
        ])  # fmt: skip
    title = (
        "per run: the all-equal share (no gradient) and its trend; f = generation / step (medians); lossless "
        "= the oracle's time ratio (speedup); seen before = groups whose prompt was drawn earlier"
    )
    return title, head, rows


def phase_table(advice: list[RunAdvice]) -> Table:
    keys = sorted({k for a in advice for k, v in a.summary.phases.items() if v is not None})
    head = ["run", "step (s)"] + [phase_label(k) for k in keys]
    rows = [[a.run.name[:24], fmt(a.summary.step_time, ".3f")] + [fmt(a.summary.phases.get(k), ".3f") for k in keys]
            for a in advice]  # fmt: skip
    return "median phase times (s) after the warm-up", head, rows


def recurrence_table(advice: list[RunAdvice]) -> Table:
    head = ["run", "seen before", "distinct prompts", "draws per prompt", "median gap", "history AUC"]
    rows = []
    for a in advice:
        r = a.recurrence
        if r is not None:
            auc = None if a.auc is None or math.isnan(a.auc) else a.auc
            rows.append([a.run.name[:24], f"{r['seen_before']:.3f}", f"{r['distinct']:.0f}",
                         f"{r['draws_per_prompt']:.2f}", fmt(r["median_gap"], ".0f"), fmt(auc, ".3f")])  # fmt: skip
    title = (
        "how often prompts recur in the prompt log (seen before: the share of groups whose prompt was drawn at "
        "an earlier step; median gap in steps) and the history's AUC on seen prompts (P(a gradient-carrying "
        "group scored above an all-equal one); 0.5: no better than chance)"
    )
    return title, head, rows


def rule_table(advice: list[RunAdvice], f: Machine | None, gen_share: float | None, console: bool) -> Table:
    head = ["rule", "r", "kept", "effective", "gen", "train", "speedup at f", "at gen share"]
    rows = []
    gpu = None if gen_share is None else Machine(gen_share)
    for p in points(advice):
        cells = _cells(advice, p, console)
        rows.append([p.rule, f"{p.rate:.2f}", *cells, _speed(p, f), _speed(p, gpu)])
    title = (
        "selection rules replayed on the prompt log: kept = expected share of the gradient-carrying groups "
        "rolled out, gen / train = cost as a share of GRPO's, speedup = ideal step time (only the exact "
        f"A = 0 drop) at f = {fmt(None if f is None else f.f, '.2f')} (the weight sync, "
        f"{fmt(None if f is None else f.fixed, '.2f')} of the step, held fixed) and "
        + (
            "at --gen-share (none given)"
            if gen_share is None
            else f"at the given generation share {gen_share:.2f}"
        )
    )
    return title, head, rows


def policy_table(advice: list[RunAdvice], console: bool) -> Table:
    """The prompt policies at the recommended mode's cost, on seen and on unseen prompts apart."""
    head = ["rule", "r", "gen", "seen: n", "kept", "eff", "vs uni", "unseen: n", "kept", "eff", "vs uni"]
    rows = []
    for rule in AT_RECOMMENDED:
        cells = [(a.replayed or {}).get(rule, {}).get(0.0) for a in advice]
        if not any(cells):
            continue

        def col(key: str, spec: str = ".3f", cells=cells) -> str:
            return _spread([None if c is None else c[key] for c in cells], spec, console)

        def over(subset: str, cells=cells) -> str:
            return _spread([None if c is None else c[f"effective_{subset}"] - c[f"uniform_{subset}"]
                            for c in cells], "+.3f", console)  # fmt: skip

        row = [rule, col("rate", ".2f"), col("gen")]
        for subset in ("seen", "unseen"):
            row += [
                col(f"grad_{subset}", ".0f"),
                col(f"kept_{subset}"),
                col(f"effective_{subset}"),
                over(subset),
            ]
        rows.append(row)
    title = (
        "the prompt policies at the recommended mode's cost (zero-share's rate, unseen prompts scored as the "
        "mean), on the gradient-carrying groups of prompts rolled out before the step (seen) and of prompts "
        "never rolled out (unseen): n = their count, kept and eff = the kept and effective share, vs uni = "
        "the effective share over a uniform draw at the same generation cost (> 0: it chooses better than "
        "chance)"
    )
    return title, head, rows


def _cells(advice: list[RunAdvice], p: Point, console: bool) -> list[str]:
    key = 0.0 if p.rule.startswith("zero-share") else None
    out = []
    for name in ("kept", "effective", "gen", "train"):
        values = []
        for a in advice:
            by_rate = (a.replayed or {}).get(p.rule, {})
            cell = by_rate.get(key if key is not None else _nearest(by_rate, p.rate))
            values.append(None if cell is None else cell[name])
        out.append(_spread(values, ".3f", console))
    return out


def _nearest(by_rate: dict[float, dict[str, float]], rate: float) -> float:
    return min(by_rate, key=lambda r: abs(r - rate)) if by_rate else rate


def _speed(p: Point, f: Machine | None) -> str:
    s = p.speedup(f)
    return NA if s is None else f"{s:.2f}x"


def tables(advice: list[RunAdvice], f, gen_share, console: bool) -> list[Table]:
    out = [run_table(advice, console), phase_table(advice)]
    if any(a.recurrence for a in advice):
        out.append(recurrence_table(advice))
    if any(a.replayed for a in advice):
        out.append(rule_table(advice, f, gen_share, console))
        out.append(policy_table(advice, console))
    return out


def _text_table(table: Table, width: int = WIDTH) -> list[str]:
    title, head, rows = table
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)] if rows else [len(h) for h in head]
    lines = textwrap.wrap(title, width)
    for row in [head, *rows]:
        line = "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return lines


def console_text(advice: list[RunAdvice], rec: Recommendation, f, gen_share) -> str:
    out: list[str] = []
    for table in tables(advice, f, gen_share, console=True):
        out += _text_table(table) + [""]
    out.append("== recommendation ==")
    if rec.flags:
        out.append("flags:")
        out += textwrap.wrap(" ".join(rec.flags), WIDTH, initial_indent="  ", subsequent_indent="    ")
    for line in rec.lines:
        out += textwrap.wrap(line, WIDTH, initial_indent="- ", subsequent_indent="  ")
    if rec.too_short:
        out.append("what the logs are too short (or lack) to tell:")
        for note in rec.too_short:
            out += textwrap.wrap(note, WIDTH, initial_indent="- ", subsequent_indent="  ")
    return "\n".join(out)


def markdown(advice: list[RunAdvice], rec: Recommendation, f, gen_share, plot: str | None) -> str:
    out = ["# openrlhf-dppo advise", "", "Runs: " + ", ".join(f"`{a.run.path}`" for a in advice), ""]
    for title, head, rows in tables(advice, f, gen_share, console=False):
        out += [title, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in rows] + [""]
    if plot:
        out += [f"![share of gradient-carrying groups against generation cost]({plot})", ""]
    out += ["## Recommendation", ""]
    if rec.flags:
        out += ["```", " \\\n    ".join(rec.flags), "```", ""]
    out += [f"- {line}" for line in rec.lines] + [""]
    if rec.too_short:
        out += ["What the logs are too short (or lack) to tell:", ""] + [f"- {n}" for n in rec.too_short]
    return "\n".join(out) + "\n"


def plot(advice: list[RunAdvice], path: Path) -> bool:
    """advise.png: kept share against generation cost, one line per rule; False when nothing to plot."""
    pts = points(advice)
    if not pts:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for rule in dict.fromkeys(p.rule for p in pts):
        mine = sorted((p for p in pts if p.rule == rule), key=lambda p: p.gen)
        style = "o" if len(mine) == 1 else "o-"
        ax.plot([p.gen for p in mine], [p.kept for p in mine], style, label=rule, markersize=4)
    ax.set_xlabel("generation cost (share of GRPO's)")
    ax.set_ylabel("share of gradient-carrying groups rolled out")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write(advice: list[RunAdvice], rec: Recommendation, f, gen_share, out: str | Path) -> Path:
    """advise.md (and advise.png when a rule was replayed) in ``out``; returns advise.md's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    has_plot = plot(advice, out / "advise.png")
    path = out / "advise.md"
    path.write_text(markdown(advice, rec, f, gen_share, "advise.png" if has_plot else None))
    return path
