"""The report's tables as (title, headers, rows of strings), rendered alike for the terminal and report.md."""

from __future__ import annotations

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import controls
from openrlhf_dppo.report.curves import Spread
from openrlhf_dppo.report.model import Arm, Comparison, Report
from openrlhf_dppo.report.summary import REWARD_WINDOW, RunSummary, eval_table, phase_label

Table = tuple[str, list[str], list[list[str]]]
NA = "—"


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table, its cells escaped."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return lines + ["| " + " | ".join(md_cell(cell) for cell in row) + " |" for row in rows]


def fmt(value: float | None, spec: str = ".3g", suffix: str = "") -> str:
    return NA if value is None else f"{value:{spec}}{suffix}"


def fmt_spread(sp: Spread, spec: str = ".3f", suffix: str = "", counted: bool = False) -> str:
    """ "mean ± sd (min–max)" over the seeds with a value (one: the value); ``counted``: "[k of n]" where
    some seeds have none."""
    if sp.mean is None:
        text = NA
    elif sp.k == 1:
        text = fmt(sp.mean, spec, suffix)
    else:
        text = f"{fmt(sp.mean, spec, suffix)} ± {fmt(sp.std, spec)} ({fmt(sp.lo, spec)}–{fmt(sp.hi, spec)})"
    if counted and sp.k < sp.n:
        text += f" [{sp.k} of {sp.n}]"
    return text


def _rate(measured_keep: float, configured: float | str | None) -> str:
    text = fmt(1.0 - measured_keep, ".3f")
    if configured is None:
        return text
    return f"{text} (cfg {configured})" if isinstance(configured, str) else f"{text} (cfg {configured:g})"


def _comparison(report: Report, arm: Arm) -> Comparison | None:
    return next((c for c in report.comparisons if c.other is arm), None)


def heldout_table(report: Report) -> Table | None:
    """Per arm: final held-out accuracy, time to the target, matched-accuracy ratio, step times."""
    if report.target is None and not any(a.curve for a in report.arms):
        return None
    headers = [
        "arm",
        "seeds",
        "final held-out acc",
        "vs baseline",
        "SE of one eval",
        "time to target (s)",
        "seeds' time to target (s)",
    ]
    headers += [
        "matched-accuracy ratio",
        "ratio vs seed spread",
        controls.COLUMN,
        "median step (s)",
        "step-time speedup",
        "start-up (s)",
        "eval time (s)",
    ]
    rows = []
    for arm in report.arms:
        c = _comparison(report, arm)
        ratio = NA
        if c is not None and c.ttt_ratio is not None:
            ratio = f"{c.ttt_ratio:.2f}"
            if c.ttt_ratios.k > 1:
                ratio += f" (seeds {c.ttt_ratios.lo:.2f}–{c.ttt_ratios.hi:.2f})"
            if c.ttt_ratios.k < c.ttt_ratios.n:
                ratio += f" [{c.ttt_ratios.k} of {c.ttt_ratios.n}]"
        elif c is not None and arm.curve is not None and report.target is not None:
            ratio = "target not reached" if arm.ttt is None else NA
        ttt = fmt(arm.ttt, ".1f") if arm.curve is not None else NA
        if arm.curve is not None and arm.ttt is None and report.target is not None:
            ttt = "not reached"
        elif (  # a time to target is measured on the arm's curve at the report's target
            arm.ttt is not None
            and arm.curve is not None
            and report.target is not None
            and arm.curve.at_target_from_start(report.target)
        ):
            ttt = f"<= {arm.ttt:.1f} (at its first smoothed point)"
        se = arm.curve.se() if arm.curve is not None else None
        delta, ttt_noise = "baseline", "baseline"
        if c is not None:
            delta = (
                NA if c.final_delta is None else f"{c.final_delta:+.4f}, {_noise(c.final_within_spread, c)}"
            )
            ttt_noise = NA if c.ttt_ratio is None else _noise(c.ttt_within_spread, c)
        rows.append(
            [arm.name, str(arm.n), fmt_spread(arm.final, ".4f"), delta, fmt(se, ".4f")]
            + [
                ttt,
                fmt_spread(arm.ttt_seeds, ".1f", counted=True),
                "baseline" if c is None else ratio,
                ttt_noise,
                controls.versus_control(report, arm),
            ]
            + [fmt_spread(arm.spread("step_time"), ".3f"), "baseline" if c is None else _speedup(c)]
            + [fmt_spread(arm.spread("startup"), ".1f"), fmt_spread(arm.spread("eval_time"), ".1f")]
        )
    target = fmt(report.target, ".4f")
    title = (
        f"Held-out accuracy ({report.heldout or 'no eval'}) against training time: target {target} = "
        f"{report.target_source}; mean ± sd (min–max) over seeds, [k of n] = seeds that reached it; "
        f"{controls.COLUMN} = the arm's time to target over that of its control of the same cost: "
        f"{controls.UNIFORM} (--dppo.prompt_policy {controls.UNIFORM_POLICY}) or {controls.BUDGET} (a "
        "smaller --rollout.batch_size)"
    )
    return title, headers, rows


def _noise(within: bool | None, c: Comparison) -> str:
    if within is None:
        return "no spread (1 seed each)" if c.baseline.n == c.other.n == 1 else "no spread (too few seeds)"
    return "within the seed spread" if within else "beyond the seed spread"


def _speedup(c: Comparison) -> str:
    if c.step_speedup is None:
        return NA
    if c.step_speedups.k > 1:
        return f"{c.step_speedup:.2f}x ({c.step_speedups.lo:.2f}–{c.step_speedups.hi:.2f}x)"
    return f"{c.step_speedup:.2f}x"


def time_table(report: Report) -> Table:
    phases = list(dict.fromkeys(k for s in report.summaries for k in s.phases))
    headers = ["run", "arm", "algo", "state", "steps", "training time (s)", "start-up (s)", "eval time (s)"]
    headers += ["median step (s)"] + [phase_label(p) + " (s)" for p in phases] + ["gen share f"]
    rows = []
    for s in report.summaries:
        startup = fmt(s.startup, ".1f")
        if s.restarts:
            startup += f" (+{s.restart_startup:.1f} in {s.restarts} restart(s))"
        row = [s.run.name, s.arm, s.run.algo, s.run.describe_state(), str(s.steps), fmt(s.train_time, ".1f")]
        row += [startup, fmt(s.eval_time, ".1f"), fmt(s.step_time, ".3f")]
        rows.append(row + [fmt(s.phases.get(p), ".3f") for p in phases] + [fmt(s.generation_share, ".3f")])
    title = (
        "Time per run (training time = sum of the step times; start-up and evaluation apart; medians over "
        f"the steps after the first {report.settings.warmup} warm-up step(s))"
    )
    return title, headers, rows


def _total(s: RunSummary, key: str) -> str:
    return fmt(s.totals.get(key), ",.0f")


def _filtered(s: RunSummary) -> bool:
    """Its untrained completions were dropped by dynamic filtering, not pruned by DPPO."""
    filtered = s.totals.get(R.SAMPLES_FILTERED)
    return bool(filtered) and not s.run.has(R.COMPLETION_KEEP_FRAC)


def work_table(report: Report) -> Table:
    headers = ["run", "tokens generated", "tokens trained", "tokens pruned", "tokens filtered"]
    headers += ["samples trained / generated", "prompt prune rate r_q", "completions not trained r_o"]
    headers += ["final training reward", "reward key"]
    rows = []
    for s in report.summaries:
        cfg_q, cfg_o = s.configured_rates
        samples = f"{_total(s, R.SAMPLES_TRAINED)} / {_total(s, R.SAMPLES_GENERATED)}"
        r_o = _rate(s.completion_keep, cfg_o)
        if _filtered(s):
            r_o += ", filtered, not pruned"
        rows.append(
            [s.run.name, *(_total(s, key) for key in R.TOKEN_KEYS), _total(s, R.TOKENS_FILTERED)]
            + [samples, _rate(s.prompt_keep, cfg_q), r_o]
            + [fmt(s.final_reward, ".4f"), s.reward_key if s.reward_raw else NA]
        )
    title = (
        f"Work and training reward (rates: measured mean after warm-up, cfg = configured; r_o = the fraction "
        f"of the generated completions not trained: pruned by DPPO (dppo/completion_keep_frac), or dropped "
        f"by dynamic filtering (tokens filtered; samples trained / generated); tokens filtered: — where the "
        f"run logs none; reward: mean of the last {REWARD_WINDOW} steps; the training reward is no held-out "
        "measure)"
    )
    return title, headers, rows


def speedup_table(report: Report) -> Table:
    headers = ["arm", "step-time speedup", "ideal speedup", "step / ideal", "f (baseline)", "g", "r_q", "r_o"]
    headers += ["lossless limit (baseline)", "comparable"]
    rows = []
    for c in report.comparisons:
        rows.append(
            [c.other.name, _speedup(c), fmt(c.ideal_speedup, ".2f", "x"), fmt(c.step_efficiency, ".0%")]
            + [
                fmt(c.f, ".3f"),
                fmt(c.rollout, ".3f") + ("" if c.rollout_measured else " (1 - r_q)"),
                fmt(c.r_q, ".3f"),
                fmt(c.r_o, ".3f"),
                fmt(c.lossless_speedup, ".2f", "x"),
                ("yes" if c.comparable else "NO (see warnings)")
                + ("" if c.control is None else f"; {controls.design_note(c)}"),
            ]
        )
    title = (
        f"Step time vs the baseline {report.baseline.name} (ideal = 1 / (g (f + (1 - f)(1 - r_o))), "
        "f from the baseline, g = the arm's samples generated per step / the baseline's, r_q / r_o measured "
        "in the arm, r_o the fraction of generated completions not trained: DPPO's pruning or dynamic "
        "filtering's drops; lossless limit = the speedup of skipping only the baseline's groups of "
        "all-equal rewards, which carry no gradient (— where not logged): faster steps than that "
        "drop groups that do; means over seeds)"
    )
    return title, headers, rows


def eval_rows(report: Report) -> Table | None:
    benches, table = eval_table(report.summaries)
    if not table:
        return None
    names = list(table)
    _, passes = eval_table(report.summaries, "pass@k")
    ks = {
        s.run.name: s.run.eval_results.get("k")
        for s in report.summaries
        if s.run.name in table and s.run.eval_results  # in the table: has eval_results.json
    }
    headers = ["benchmark"] + [f"{n} {m}" for n in names for m in ("avg@k", "pass@k")]
    rows = [[b] + [fmt(t.get(n, {}).get(b), ".4f") for n in names for t in (table, passes)] for b in benches]
    k_text = ", ".join(f"{n}: k={k}" for n, k in ks.items())
    return f"Evaluation from eval_results.json ({k_text})", headers, rows


def training_eval_rows(report: Report) -> Table | None:
    """Per run: the held-out curve's last eval point, its smoothed final, the steps of that median, the SE."""
    runs = [(s.run.name, s.heldout) for s in report.summaries if s.heldout is not None]
    if not runs:
        return None
    headers = [
        "run",
        "eval points",
        "last eval (step)",
        "final (smoothed)",
        "final = median of steps",
        "SE of one eval",
        "training time (s)",
    ]
    rows = [
        [name, str(len(curve.steps)), f"{curve.raw[-1]:.4f} ({curve.steps[-1]})"]
        + [fmt(curve.final, ".4f"), ", ".join(map(str, curve.final_steps)) or NA]
        + [fmt(curve.se(), ".4f"), f"{curve.times[-1]:.1f}"]
        for name, curve in runs
    ]
    window = report.settings.eval_window
    return (
        f"Held-out curve per run ({report.heldout}; final = median of the last {window} eval points)",
        headers,
        rows,
    )


def summary_table(report: Report) -> Table:
    """The console's table, one row per arm in about 100 columns."""
    headers = ["arm", "seeds", "final acc", "vs baseline", "time to target", "vs control", "step speedup"]
    rows = []
    for arm in report.arms:
        c = _comparison(report, arm)
        final = arm.final
        acc = NA if final.mean is None else fmt(final.mean, ".4f")
        if final.k > 1:
            acc += f" ± {fmt(final.std, '.4f')}"
        if c is None:
            vs, ttt = "baseline", "baseline" if arm.ttt is None else f"{arm.ttt:.1f} s"
            speed = f"{fmt(arm.mean_of('step_time'), '.2f')} s a step"
        else:
            vs = (
                NA
                if c.final_delta is None
                else f"{c.final_delta:+.4f}, {_short_noise(c.final_within_spread)}"
            )
            ttt = _short_ratio(report, arm, c)
            speed = _speedup(c)
            if c.ideal_speedup is not None and c.step_efficiency is not None:
                speed += f", {c.step_efficiency:.0%} of {c.ideal_speedup:.2f}x"
        rows.append([arm.name, str(arm.n), acc, vs, ttt, controls.versus_control(report, arm, True), speed])
    title = (
        f"Against the baseline {report.baseline.name}: held-out accuracy ({report.heldout or 'no eval'}), "
        f"target {fmt(report.target, '.4f')}; time to target = the arm's training time over the "
        f"baseline's, [k of n] = seeds that reached it; vs control = {controls.COLUMN}: over that of its "
        f"control, {controls.UNIFORM} ({controls.SHORT[controls.UNIFORM]}) or {controls.BUDGET} "
        f"({controls.SHORT[controls.BUDGET]})"
    )
    return title, headers, rows


def _short_noise(within: bool | None) -> str:
    return {True: "within spread", False: "beyond spread", None: "no spread"}[within]


def _short_ratio(report: Report, arm: Arm, c: Comparison) -> str:
    if c.ttt_ratio is None:
        reached = arm.curve is not None and report.target is not None and arm.ttt is None
        text = "not reached" if reached else NA
    else:
        text = f"{c.ttt_ratio:.2f}x"
        if c.ttt_ratios.k > 1:
            text += f" ({c.ttt_ratios.lo:.2f}–{c.ttt_ratios.hi:.2f})"
    if c.ttt_ratios.n > 1 and c.ttt_ratios.k < c.ttt_ratios.n:
        text += f" [{c.ttt_ratios.k} of {c.ttt_ratios.n}]"
    return text


def all_tables(report: Report) -> list[Table]:
    tables = [heldout_table(report), time_table(report), work_table(report)]
    tables.append(speedup_table(report) if report.comparisons else None)
    return [t for t in tables + [training_eval_rows(report), eval_rows(report)] if t]
