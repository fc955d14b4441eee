"""What one or more runs' logs say about pruning on their task (``openrlhf-dppo advise``).

Per run directory, from metrics.jsonl (``report.summary``: compare's own numbers) and, where the run was
made with ``--dppo.prompt_log true``, prompts.jsonl (``prompt_log``):

1. the all-equal share (groups whose G rewards are all equal: no policy gradient) per step, from
   ``rollout/equal_reward_frac_ht`` or else from the prompt log; its mean, the means of the first and
   second half of the steps and a least-squares slope (per 100 steps);
2. f (the generation share of a step: median generation / median step time, after ``warmup``) and the
   median phase times;
3. the lossless limit (``speedup.lossless_time_ratio``: the training time an oracle that skips only the
   all-equal groups would need, as a fraction of the run's own);
4. how often prompts recur: the share of the logged groups whose prompt was drawn at an earlier step,
   the distinct prompts, draws per prompt, the median gap in steps between two draws of a prompt (a
   history can only score a prompt it has seen);
5. the selection rules replayed on the log (``report.selection``), with the history at the run's own
   ``--dppo.history_decay``, ``--dppo.history_prior``, ``--dppo.reward_kind`` and ``--dppo.q_min``, and
   the history's AUC on seen prompts.

A run whose log has prompts rolled out with q < 1 (a DPPO run) is not replayed: its log holds only what
its own rule kept; nor is a log in which no group carried gradient (every group's G rewards equal):
there is nothing to select, and a kept share of no groups is undefined. Each run's ``notes`` say what its logs are too short, or lack, to tell.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from openrlhf_dppo import prompt_log
from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import speedup as S
from openrlhf_dppo.report.run import Run, RunDirError, load_run
from openrlhf_dppo.report.selection import Replay, Step, history_auc, read_steps, replay
from openrlhf_dppo.report.summary import RunSummary, Settings, summarize

MIN_STEPS_TREND = 50  # fewer steps: the trend of the share is not told
MIN_RECURRENCE = 0.3  # a smaller share of groups seen before: the history is judged on too few prompts
NO_GRADIENT = "no group carried gradient (every group's G rewards were equal); nothing to select"


@dataclass
class RunAdvice:
    run: Run
    summary: RunSummary
    shares: list[float]  # the all-equal share of each step, in step order
    share_source: str | None  # the metric, "prompts.jsonl", or None (neither)
    trend: dict[str, float] | None  # first_half, second_half, slope_per_100 (None: no share)
    recurrence: dict[str, float] | None  # seen_before, distinct, draws_per_prompt, median_gap
    replayed: dict[str, dict[float, dict[str, float]]] | None  # report.selection.replay
    auc: float | None
    config: Replay
    group_size: int | None
    lengths_logged: bool
    warmup: int = 1
    no_gradient: bool = False  # a GRPO prompt log in which every group's rewards were all equal
    notes: list[str] = field(default_factory=list)

    @property
    def lossless(self) -> float | None:
        """The lossless time ratio: compare's (the logged share), else from the prompt log's shares."""
        if self.summary.lossless_ratio is not None:
            return self.summary.lossless_ratio
        if self.share_source != prompt_log.PROMPT_LOG:
            return None
        times = [R.number(r.get(R.STEP_TOTAL)) for r in S.after_warmup(self.run.train, self.warmup)]
        shares = S.after_warmup(self.shares, self.warmup)
        if not shares or len(times) != len(shares) or any(t is None for t in times):
            return None
        return S.lossless_time_ratio(shares, [t for t in times if t is not None])


def trend(shares: list[float]) -> dict[str, float]:
    """Means of the first and second half of the steps and the least-squares slope per 100 steps."""
    half = len(shares) // 2
    x = np.arange(len(shares), dtype=np.float64)
    slope = float(np.polyfit(x, np.asarray(shares), 1)[0]) * 100 if len(shares) >= 2 else 0.0
    return {
        "mean": statistics.fmean(shares),
        "first_half": statistics.fmean(shares[:half]) if half else float("nan"),
        "second_half": statistics.fmean(shares[half:]),
        "slope_per_100": slope,
    }


def recurrence(steps: list[Step]) -> dict[str, float]:
    """How often the logged prompts recur (module docstring, item 4)."""
    last: dict[int, int] = {}
    gaps: list[int] = []
    seen_before = total = 0
    for number, step in enumerate(steps, 1):
        for i in step.index.tolist():
            total += 1
            if i in last and last[i] < number:
                seen_before += 1
                gaps.append(number - last[i])
            last[i] = number
    return {
        "seen_before": seen_before / total if total else float("nan"),
        "distinct": float(len(last)),
        "draws_per_prompt": total / len(last) if last else float("nan"),
        "median_gap": float(statistics.median(gaps)) if gaps else float("nan"),
    }


def load_steps(run: Run) -> tuple[list[Step] | None, str | None]:
    """The run's logged steps, or None and why not (no prompt log); a DPPO log comes with why it is not
    replayed."""
    try:
        steps, grpo = read_steps(run.path)
    except RunDirError as err:
        return None, str(err)
    if not steps:
        return None, f"{run.name}: prompts.jsonl has no trained step"
    if not grpo:
        return steps, (
            f"{run.name}: prompts were rolled out with q < 1 (a DPPO run): its log holds only what its own "
            "rule kept, so the rules are not replayed (make a GRPO run with --dppo.prompt_log true)"
        )
    return steps, None


def run_config(run: Run, rates: tuple[float, ...], ks: tuple[int, ...]) -> Replay:
    """The replay's settings from the run's ``--dppo.*`` (the config's defaults where not recorded)."""
    dppo: dict[str, Any] = (run.config.get("args") or {}).get("dppo") or {}
    base = Replay()
    return Replay(
        rates=rates,
        decay=float(dppo.get("history_decay", base.decay)),
        prior=float(dppo.get("history_prior", base.prior)),
        reward_kind=str(dppo.get("reward_kind", base.reward_kind)),
        q_min=float(dppo.get("q_min", base.q_min)),
        screen_ks=ks,
        zero_share_cap=float(dppo.get("prompt_prune_rate_max", base.zero_share_cap)),
        zero_drop=zero_drop_allowed(run.config.get("args") or {}),
        estimator=estimator_of(run.config.get("args") or {}) or base.estimator,
    )


def estimator_of(args: dict) -> str | None:
    """The run's ``--algo.advantage.estimator`` (None where not recorded)."""
    value = (((args.get("algo") or {}).get("advantage")) or {}).get("estimator")
    return None if value is None else str(value)


def zero_drop_allowed(args: dict) -> bool:
    """Whether a DPPO run with this run's flags drops advantage-0 completions exactly (the experience maker's
    rule): --dppo.drop_zero_advantage, no KL (in reward or loss) or entropy term, no batch whitening."""
    algo, actor = args.get("algo") or {}, args.get("actor") or {}
    kl = float(((algo.get("kl") or {}).get("init_coef")) or 0.0) > 0
    entropy = float(actor.get("entropy_coef") or 0.0) != 0
    whitened = estimator_of(args) == "reinforce_baseline"
    return bool((args.get("dppo") or {}).get("drop_zero_advantage", True)) and not (kl or entropy or whitened)


def analyse(path: str, settings: Settings, rates: tuple[float, ...], ks: tuple[int, ...]) -> RunAdvice:
    """One run directory's advice (module docstring); raises RunDirError when it cannot be read."""
    run = load_run(path)
    summary = summarize(run, settings)
    notes: list[str] = []
    steps, why = load_steps(run)
    if steps is None and why:
        notes.append(f"no prompt log ({why}): the selection rules and the recurrence of prompts are not told")
        why = None
    elif why:
        notes.append(why)
    cfg = run_config(run, rates, ks)
    shares_logged = [R.number(r.get(R.EQUAL_REWARD_FRAC_HT)) for r in run.train]
    if run.train and all(u is not None for u in shares_logged):
        shares, source = [u for u in shares_logged if u is not None], R.EQUAL_REWARD_FRAC_HT
    elif steps is not None and why is None:
        shares, source = [float(1.0 - s.grad.mean()) for s in steps], prompt_log.PROMPT_LOG
    else:
        shares, source = [], None
        notes.append(
            f"neither {R.EQUAL_REWARD_FRAC_HT} on every step nor a GRPO prompt log: no all-equal share"
        )
    if shares and len(shares) < MIN_STEPS_TREND:
        notes.append(f"{len(shares)} steps (< {MIN_STEPS_TREND}): the share's trend is not told")
    if summary.generation_share is None:
        notes.append(f"no {R.GENERATION} / {R.STEP_TOTAL}: f is not told (use --gen-share)")
    replayed = auc = rec = None
    group_size = None
    lengths = False
    if steps is not None:
        rec = recurrence(steps)
        group_size = int(steps[0].rewards.shape[1])
        lengths = all(s.lengths is not None for s in steps)
        if rec["seen_before"] < MIN_RECURRENCE:
            notes.append(
                f"only {rec['seen_before']:.0%} of the logged groups were of a prompt seen before: the history "
                "rules are judged mostly on unseen prompts (a longer run, more epochs, tells more)"
            )
    no_gradient = steps is not None and why is None and not any(s.grad.any() for s in steps)
    if no_gradient:
        notes.append(NO_GRADIENT)
    elif steps is not None and why is None:
        replayed, auc = replay(steps, cfg), history_auc(steps, cfg)
        if not lengths and any(0 < k < (group_size or 0) for k in ks):
            notes.append(
                "no completion lengths in prompts.jsonl: screening's second round is charged a whole round "
                "(an upper bound on its cost)"
            )
    if run.algo != "grpo":
        notes.append(
            f"a {run.algo} run: its f, phase times and shares are of its own pruned steps, not GRPO's (advise "
            "reads best a GRPO run)"
        )
    notes = [n if n.startswith(f"{run.name}:") else f"{run.name}: {n}" for n in notes]
    return RunAdvice(
        run=run,
        summary=summary,
        shares=shares,
        share_source=source,
        trend=trend(shares) if shares else None,
        recurrence=rec,
        replayed=replayed,
        auc=auc,
        config=cfg,
        group_size=group_size,
        lengths_logged=lengths,
        warmup=settings.warmup,
        no_gradient=no_gradient,
        notes=notes,
    )


def step_ratio(f: float, gen: float, train: float, fixed: float = 0.0) -> float:
    """A step's time as a share of GRPO's from the generation and training costs (no completion pruning):
    fixed + f gen + (1 - f - fixed) train, ``fixed`` the share of the step that does not scale with the
    rollout (the weight sync); with gen = train = 1 - r_q and fixed = 0 it is
    ``speedup.ideal_step_ratio(f, r_q, 0)``."""
    if not (0.0 <= f <= 1.0 and 0.0 <= fixed <= 1.0 - f):
        raise ValueError(
            f"f and fixed must be shares of one step (f in [0, 1], fixed in [0, 1 - f]), got {f}, {fixed}"
        )
    return fixed + f * gen + (1.0 - f - fixed) * train


@dataclass(frozen=True)
class Machine:
    """Where a GRPO step's time goes, as shares of it: generation ``f`` and ``fixed``, the weight sync,
    which broadcasts the weights whatever the rollout holds; the rest (the experience and training phases)
    scales with the tokens trained."""

    f: float
    fixed: float = 0.0

    def step_ratio(self, gen: float, train: float) -> float:
        return step_ratio(self.f, gen, train, self.fixed)


def measured_machine(advice: list[RunAdvice]) -> Machine | None:
    """The runs' mean f and weight-sync share (median phase / median step, each run); None without f."""
    fs, syncs = [], []
    for a in advice:
        s = a.summary
        if s.generation_share is None or not s.step_time:
            continue
        fs.append(s.generation_share)
        sync = s.phases.get(R.BROADCAST)
        syncs.append(0.0 if sync is None else min(sync / s.step_time, 1.0 - s.generation_share))
    return Machine(statistics.fmean(fs), statistics.fmean(syncs)) if fs else None


def pooled(advice: list[RunAdvice]) -> dict[str, dict[float, dict[str, list[float]]]]:
    """{rule: {rate: {key: [value per replayed run]}}} over the runs that were replayed."""
    out: dict[str, dict[float, dict[str, list[float]]]] = {}
    for a in advice:
        for rule, by_rate in (a.replayed or {}).items():
            for rate, values in by_rate.items():
                cell = out.setdefault(rule, {}).setdefault(rate, {})
                for key, value in values.items():
                    cell.setdefault(key, []).append(value)
    return out
