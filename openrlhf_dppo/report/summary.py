"""One run's numbers for the compare report (:class:`RunSummary`). The time axis is training time
(``time/train_s``, else the cumulative ``timing/step_total``); start-up and evaluation are apart."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from itertools import accumulate

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import speedup as S
from openrlhf_dppo.report.curves import Curve, running_median
from openrlhf_dppo.report.run import Run, number, series

PHASE_LABELS = {
    R.GENERATION: "generation",
    R.MAKE_EXPERIENCE: "experience",
    R.PPO_TRAIN: "training",
    R.BROADCAST: "weight sync",
}
REWARD_WINDOW = 5  # steps of the trailing mean of the training reward


def phase_label(key: str) -> str:
    """Display name of a timing/* key (OpenRLHF's own names for the four phases, the key otherwise)."""
    return PHASE_LABELS.get(key, key.removeprefix(R.TIMING_PREFIX))


@dataclass(frozen=True)
class Settings:
    warmup: int = 1  # leading steps left out of every median and mean
    target: float | None = None  # held-out accuracy target; None: the baseline arm's final accuracy
    eval_window: int = 3  # running-median window over eval points (report.curves)
    heldout: str | None = None  # eval dataset; None: the one all runs share, or the mean of several

    def __post_init__(self):
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.eval_window < 1 or self.eval_window % 2 == 0:
            raise ValueError(f"--eval-window must be an odd number >= 1, got {self.eval_window}")
        if self.target is not None and not 0.0 <= self.target <= 1.0:
            raise ValueError(f"--target is a held-out accuracy in [0, 1], got {self.target}")


@dataclass
class RunSummary:
    run: Run
    steps: int
    steps_used: int  # steps entering the medians (after warm-up)
    train_time: float | None  # training time at the last logged step
    time_source: str  # where the training time comes from
    startup: float | None  # process start (without time/startup_s: the writer's start) -> first step
    restarts: int  # further process starts (resumes) logged in metrics.jsonl
    restart_startup: float  # their start-up, summed
    eval_time: float | None  # summed timing/eval (None: not logged)
    step_time: float | None  # median timing/step_total
    phases: dict[str, float | None]  # median of every timing/* key but the total
    generation_share: float | None  # median generation / median step total
    lossless_ratio: float | None  # speedup.lossless_time_ratio over the steps used (None: not logged)
    totals: dict[str, float | None]  # summed tokens/* and samples/* (None: never logged)
    reward_key: str  # rollout/reward_ht when logged, else rollout/reward_mean
    reward_steps: list[int]
    reward_times: list[float]  # training time
    reward_raw: list[float]
    reward_smoothed: list[float]
    generated_per_step: float | None  # mean samples/generated after warm-up (None: not logged)
    prompt_keep: float  # measured mean kept fraction of prompts (1.0 without pruning)
    completion_keep: float
    keep_source: str  # which metrics the kept fractions come from
    # (r_q, r_o) from run_config.json: r_q "zero-share from 0.5" under the rate control; GRPO_RATES for GRPO
    configured_rates: tuple[float | str | None, float | str | None]
    heldout: Curve | None = None  # set by the report once the held-out dataset is chosen
    clock_notes: list[str] = field(default_factory=list)
    # after warm-up: median perf/forward_batches, max perf/forward_tokens_max (None: not logged)
    forward_batches: float | None = None
    forward_tokens_max: float | None = None
    arm: str = ""

    @property
    def final_reward(self) -> float | None:
        return self.reward_smoothed[-1] if self.reward_smoothed else None


def _keep_fraction(rows: list[dict], key: str, num: str, den: str) -> tuple[float, str]:
    """Mean kept fraction over ``rows``: the dppo/* metric, else num/den counts, else 1 (no pruning)."""
    _, values = series(rows, key)
    if values:
        return statistics.fmean(values), key
    pairs = [(number(row.get(num)), number(row.get(den))) for row in rows]
    fractions = [n / d for n, d in pairs if n is not None and d]
    if fractions:
        return statistics.fmean(fractions), f"{num} / {den}"
    return 1.0, "none logged (taken as 1)"


def train_clock(run: Run) -> tuple[dict[int, float], str]:
    """({step: training time at the end of the step}, its source)."""
    if run.train and all(number(row.get(R.TRAIN_S)) is not None for row in run.train):
        return {row[R.STEP]: float(row[R.TRAIN_S]) for row in run.train}, R.TRAIN_S
    totals = accumulate(number(row.get(R.STEP_TOTAL)) or 0.0 for row in run.train)
    return dict(zip((row[R.STEP] for row in run.train), totals)), f"cumulative {R.STEP_TOTAL}"


def time_at(clock: dict[int, float], step: int) -> float:
    """Training time at the end of ``step`` (of the last logged step before it; 0 before the first)."""
    done = [s for s in clock if s <= step]
    return clock[max(done)] if done else 0.0


def _startups(run: Run) -> tuple[float | None, int, float, str | None]:
    """(start-up of the first process, number of restarts, their summed start-up, a note or None)."""
    values = [number(row.get(R.STARTUP_S)) for row in run.train if R.STARTUP_S in row]
    logged = [v for v in values if v is not None]
    first = run.train[0] if run.train else {}
    if number(first.get(R.STARTUP_S)) is not None:
        return logged[0], len(logged) - 1, sum(logged[1:]), None
    wall, total = number(first.get(R.WALL_TIME)), number(first.get(R.STEP_TOTAL))
    if wall is not None and total is not None:
        note = "no time/startup_s: start-up counted from the run directory's creation, not the process start"
        return max(wall - total, 0.0), 0, 0.0, note
    return None, 0, 0.0, None


def heldout_curve(run: Run, datasets: list[str], clock: dict[int, float], window: int) -> Curve | None:
    """The run's held-out accuracy against training time: eval_<dataset>_pass1 (the mean over
    ``datasets`` when several) at every eval line that has them all, smoothed (report.curves)."""
    keys = [R.pass1_key(d) for d in datasets]
    steps, times, raw, counts = [], [], [], []
    for row in run.evals:
        logged = [number(row.get(k)) for k in keys]
        values = [v for v in logged if v is not None]
        if not keys or len(values) < len(logged):
            continue
        steps.append(row[R.STEP])
        own = number(row.get(R.TRAIN_S))
        times.append(own if own is not None else time_at(clock, row[R.STEP]))
        raw.append(sum(values) / len(values))
        counts.append(number(row.get(R.EVAL_NUM_SAMPLES)))
    if not steps:
        return None
    label = datasets[0] if len(datasets) == 1 else "mean of " + ", ".join(datasets)
    return Curve(
        label, steps, times, raw, running_median(raw, window), _eval_n(run, datasets, counts), window
    )


def _eval_n(run: Run, datasets: list[str], counts: list[float | None]) -> float | None:
    """Independent samples behind one eval point: eval_num_samples (prompts x samples), per prompt
    when the eval is greedy (temperature 0: the samples of one prompt agree); None for several datasets
    (OpenRLHF counts them together) or when not logged."""
    known = [c for c in counts if c is not None]
    if len(datasets) != 1 or not known:
        return None
    n = min(known)
    ev = (run.config.get("args") or {}).get("eval") or {}
    per_prompt = number(ev.get("n_samples_per_prompt"))
    if number(ev.get("temperature")) == 0.0 and per_prompt:
        n /= per_prompt
    return n


def _lossless_ratio(used: list[dict]) -> float | None:
    """speedup.lossless_time_ratio over the steps used; None unless every one logs its equal-reward
    share and step time (a run from before the metric, or a reward model's run)."""
    shares, times = [], []
    for row in used:
        u, t = number(row.get(R.EQUAL_REWARD_FRAC_HT)), number(row.get(R.STEP_TOTAL))
        if u is None or t is None:
            return None
        shares.append(u)
        times.append(t)
    return S.lossless_time_ratio(shares, times) if used else None


def summarize(run: Run, settings: Settings) -> RunSummary:
    # medians and means skip the first `warmup` steps (all steps are kept when that would leave none)
    used = S.after_warmup(run.train, settings.warmup)
    phase_keys = list(R.PHASES) + sorted(
        {k for row in run.train for k in row if k.startswith(R.TIMING_PREFIX) and k != R.STEP_TOTAL}
        - set(R.PHASES)
    )
    phases = {k: S.median_or_none(series(used, k)[1]) for k in phase_keys}
    step_time = S.median_or_none(series(used, R.STEP_TOTAL)[1])
    sums = {}
    for key in R.TOKEN_KEYS + R.SAMPLE_KEYS + (R.TOKENS_FILTERED, R.SAMPLES_FILTERED):
        _, values = run.series(key)
        sums[key] = sum(values) if values else None

    clock, time_source = train_clock(run)
    notes = (
        []
        if time_source == R.TRAIN_S or not run.train
        else [f"no {R.TRAIN_S}: training time = {time_source}"]
    )
    startup, restarts, restart_startup, startup_note = _startups(run)
    notes += [startup_note] if startup_note else []
    eval_times = [v for v in (number(row.get(R.EVAL_TIME)) for row in run.evals) if v is not None]
    reward_key = R.REWARD_HT if run.has(R.REWARD_HT) else R.REWARD_MEAN
    reward_steps, reward = run.series(reward_key)
    dppo_cfg = run.config.get("dppo") or {}
    prompt_keep, src_q = _keep_fraction(used, R.PROMPT_KEEP_FRAC, R.PROMPTS_ROLLED_OUT, R.PROMPTS_DRAWN)
    completion_keep, src_o = _keep_fraction(
        used, R.COMPLETION_KEEP_FRAC, R.SAMPLES_TRAINED, R.SAMPLES_GENERATED
    )
    return RunSummary(
        run=run,
        steps=len(run.train),
        steps_used=len(used),
        train_time=clock[run.train[-1][R.STEP]] if run.train else None,
        time_source=time_source,
        startup=startup,
        restarts=restarts,
        restart_startup=restart_startup,
        eval_time=sum(eval_times) if eval_times else None,
        step_time=step_time,
        forward_batches=S.median_or_none(series(used, R.FORWARD_BATCHES)[1]),
        forward_tokens_max=max(series(used, R.FORWARD_TOKENS_MAX)[1], default=None),
        phases=phases,
        generation_share=S.ratio_or_none(phases[R.GENERATION], step_time),
        lossless_ratio=_lossless_ratio(used),
        totals=sums,
        reward_key=reward_key,
        reward_steps=reward_steps,
        reward_times=[clock[s] for s in reward_steps],
        reward_raw=reward,
        reward_smoothed=S.moving_average(reward, REWARD_WINDOW),
        generated_per_step=S.mean_or_none(series(used, R.SAMPLES_GENERATED)[1]),
        prompt_keep=prompt_keep,
        completion_keep=completion_keep,
        keep_source=f"prompts: {src_q}, completions: {src_o}",
        configured_rates=_configured_rates(run.algo, dppo_cfg),
        clock_notes=notes,
    )


#: a GRPO run's configured rates (its --dppo.* rates, recorded or not, prune nothing)
GRPO_RATES = ("GRPO", "GRPO")


def _configured_rates(algo: str | None, dppo_cfg: dict) -> tuple[float | str | None, float | str | None]:
    """(r_q, r_o) as configured: DPPO's rates; a peer's own rule where --dppo.prompt_prune_rate does not
    apply (CPPO prunes no prompt and P of each group, GRESO skips by its streaks and prunes no completion)."""
    if algo == "grpo":
        return GRPO_RATES
    if algo == "cppo":
        return "CPPO: none", dppo_cfg.get("completion_prune_rate")
    if algo == "greso":
        return "GRESO's skip", "GRESO: none"
    return _configured_prompt_rate(dppo_cfg), dppo_cfg.get("completion_prune_rate")


def _configured_prompt_rate(dppo_cfg: dict) -> float | str | None:
    """The configured r_q, or how a rate control set it per draw (no control recorded: fixed)."""
    rate, control = dppo_cfg.get("prompt_prune_rate"), dppo_cfg.get("prompt_rate_control", "fixed")
    if control in (None, "fixed"):
        return rate
    return f"{control} from {rate:g}" if isinstance(rate, (int, float)) else str(control)


def eval_table(summaries: list[RunSummary], metric: str = "avg@k") -> tuple[list[str], dict[str, dict]]:
    """(benchmark names + "average", {run name: {benchmark: value}}) over runs with eval_results.json."""
    table: dict[str, dict[str, float]] = {}
    for s in summaries:
        res = s.run.eval_results
        if not res:
            continue
        row = {b: float(v[metric]) for b, v in (res.get("benchmarks") or {}).items() if metric in v}
        if metric in (res.get("average") or {}):
            row["average"] = float(res["average"][metric])
        table[s.run.name] = row
    benches = sorted({b for row in table.values() for b in row if b != "average"})
    if any("average" in row for row in table.values()):
        benches.append("average")
    return benches, table
