"""``openrlhf-dppo advise``'s output: the console text (at most ``WIDTH`` columns) and advise.md, the same
tables (the mean over runs in the console, mean ± sd (min–max) in the markdown) from ``report.advise``."""

from __future__ import annotations

import math
import statistics
import textwrap
from pathlib import Path

from openrlhf_dppo.report.advise import Machine, RunAdvice, methods, projection
from openrlhf_dppo.report.curves import Spread
from openrlhf_dppo.report.tables import NA, Table, fmt, fmt_spread, markdown_table

WIDTH = 100


def _spread(values: list[float | None], spec: str, console: bool, suffix: str = "") -> str:
    sp = Spread.of(None if v is None or math.isnan(v) else v for v in values)
    if not console:
        return fmt_spread(sp, spec)
    text = fmt(sp.mean, spec)
    return text if text == NA else text + suffix


def run_table(advice: list[RunAdvice]) -> Table:
    head = ["run", "steps", "all-equal", "step (s)", "f", "sync", "lossless"]
    rows = []
    for a in advice:
        m, lossless = a.machine, a.summary.lossless_ratio
        rows.append([
            a.run.name[:24], str(a.summary.steps), fmt(a.mean_share, ".3f"), fmt(a.summary.step_time, ".3f"),
            fmt(None if m is None else m.f, ".3f"), fmt(None if m is None else m.fixed, ".3f"),
            NA if lossless is None else f"{lossless:.3f} ({1 / lossless:.2f}x)" if lossless > 0 else "0",
        ])  # fmt: skip
    title = (
        "per run: the all-equal share (groups without gradient); step = the median step time; f and sync = "
        "the generation and the weight sync's share of a step (medians); lossless = the time of an oracle "
        "that skips only the all-equal groups, as a share of the run's (its speedup)"
    )
    return title, head, rows


def method_table(
    advice: list[RunAdvice], gen_share: float | None, completion_rate: float, console: bool
) -> Table:
    head = ["method", "rolled out", "trained", "speedup at f", "at gen share"]
    rows = []
    at_share = None if gen_share is None else Machine(gen_share)
    for method in methods(completion_rate):
        own = [
            None if a.machine is None else projection(a, method, a.machine, completion_rate) for a in advice
        ]
        given = [
            None if at_share is None else projection(a, method, at_share, completion_rate) for a in advice
        ]
        cost = [o or g for o, g in zip(own, given)]  # gen and train do not depend on the machine
        rows.append([
            method.name,
            _spread([None if p is None else p.gen for p in cost], ".2f", console),
            _spread([None if p is None else p.train for p in cost], ".2f", console),
            _spread([None if p is None else p.speedup for p in own], ".2f", console, "x"),
            _spread([None if p is None else p.speedup for p in given], ".2f", console, "x"),
        ])  # fmt: skip
    fs = [a.machine.f for a in advice if a.machine is not None]
    title = (
        "projected step time against GRPO's: rolled out and trained = a step's generated and trained tokens "
        "as a share of GRPO's; speedup at f = at each run's own f and weight sync "
        f"(mean f {fmt(statistics.fmean(fs) if fs else None, '.2f')}), at gen share = at --gen-share "
        + ("(none given)" if gen_share is None else f"{gen_share:.2f} with no sync")
    )
    return title, head, rows


def flag_lines(completion_rate: float) -> list[tuple[str, str]]:
    """(method, the flags to add to a train command) for each method."""
    return [(m.name, " ".join(m.flags) or "(none: the defaults)") for m in methods(completion_rate)]


def reading(advice: list[RunAdvice]) -> list[str]:
    """How to read the projections, with the all-equal share where one was logged."""
    out = []
    shares = [a.mean_share for a in advice if a.mean_share is not None]
    limits = [1.0 / a.summary.lossless_ratio for a in advice if a.summary.lossless_ratio]
    if shares:
        limit = f" (lossless limit {statistics.fmean(limits):.2f}x)" if limits else ""
        out.append(
            f"all-equal share {statistics.fmean(shares):.3f}{limit}: the most of a GRPO batch that pruning skips "
            "at no cost to the gradient; a method projected faster than the limit trains fewer "
            "gradient-carrying groups a step than GRPO"
        )
    out += [
        "DPPO's draw and the uniform draw project alike: the history's draw was measured no better than a "
        "uniform one at the same rate (benchmarks/RESULTS.md); the uniform draw is the control to run beside it",
        "a projection is of step time only: what a step learns decides the time to GRPO's accuracy; measure "
        "it with openrlhf-dppo compare (docs/REPORT.md)",
    ]
    return out


def tables(
    advice: list[RunAdvice], gen_share: float | None, completion_rate: float, console: bool
) -> list[Table]:
    out = [run_table(advice)]
    if any(a.shares for a in advice):  # a projection needs the all-equal share
        out.append(method_table(advice, gen_share, completion_rate, console))
    return out


def _text_table(table: Table, width: int = WIDTH) -> list[str]:
    title, head, rows = table
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)] if rows else [len(h) for h in head]
    lines = textwrap.wrap(title, width)
    for row in [head, *rows]:
        line = "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return lines


def _notes(advice: list[RunAdvice]) -> list[str]:
    return sorted({note for a in advice for note in a.notes})


def console_text(advice: list[RunAdvice], gen_share: float | None, completion_rate: float) -> str:
    out: list[str] = []
    for table in tables(advice, gen_share, completion_rate, console=True):
        out += _text_table(table) + [""]
    out.append("flags to add to the train command:")
    pad = max(len(name) for name, _ in flag_lines(completion_rate))
    for name, flags in flag_lines(completion_rate):
        out += textwrap.wrap(
            flags, WIDTH, initial_indent=f"  {name.ljust(pad)}  ", subsequent_indent=" " * (pad + 4)
        )
    out.append("")
    for line in reading(advice):
        out += textwrap.wrap(line, WIDTH, initial_indent="- ", subsequent_indent="  ")
    if _notes(advice):
        out.append("what the logs lack to tell:")
        for note in _notes(advice):
            out += textwrap.wrap(note, WIDTH, initial_indent="- ", subsequent_indent="  ")
    return "\n".join(out)


def markdown(advice: list[RunAdvice], gen_share: float | None, completion_rate: float) -> str:
    out = ["# openrlhf-dppo advise", "", "Runs: " + ", ".join(f"`{a.run.path}`" for a in advice), ""]
    for title, head, rows in tables(advice, gen_share, completion_rate, console=False):
        out += [title, "", *markdown_table(head, rows), ""]
    flags = [[name, f"`{flags}`"] for name, flags in flag_lines(completion_rate)]
    out += [*markdown_table(["method", "flags"], flags), ""]
    out += [f"- {line}" for line in reading(advice)] + [""]
    if _notes(advice):
        out += ["What the logs lack to tell:", ""] + [f"- {n}" for n in _notes(advice)]
    return "\n".join(out) + "\n"


def write(advice: list[RunAdvice], gen_share: float | None, completion_rate: float, out: str | Path) -> Path:
    """advise.md in ``out``; returns its path."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    path = path / "advise.md"
    path.write_text(markdown(advice, gen_share, completion_rate), encoding="utf-8")
    return path
