"""``openrlhf-dppo advise`` (docs/ADVISE.md): per run directory, the all-equal share u_i
(``rollout/equal_reward_frac_ht``), f and the weight sync's share, the lossless limit, and each method's
projected step time as a share of GRPO's (:func:`projection`). A run without u_i on every step gets no
projection; ``RunAdvice.notes`` say what is missing."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from openrlhf_dppo import run_dir as R
from openrlhf_dppo.report import speedup as S
from openrlhf_dppo.report.run import Run, load_run
from openrlhf_dppo.report.summary import RunSummary, Settings, summarize

NO_GRADIENT = "no group carried gradient (every group's G rewards were equal)"


@dataclass(frozen=True)
class Method:
    """A method the CLI offers: its name, the flags that run it, and its step model."""

    name: str
    flags: tuple[str, ...]
    kind: str  # "grpo", "dppo" (the defaults' prompt pruning), "completion", "filter"


def methods(completion_rate: float) -> tuple[Method, ...]:
    """The methods ``advise`` projects, completion pruning at ``completion_rate``."""
    return (
        Method("GRPO", ("--dppo.method grpo",), "grpo"),
        Method("DPPO (the defaults)", (), "dppo"),
        Method("DPPO, uniform draw (control)", ("--dppo.prompt_policy uniform",), "dppo"),
        Method(
            f"DPPO + completion pruning {completion_rate:g}",
            (f"--dppo.completion_prune_rate {completion_rate:g}",),
            "completion",
        ),
        Method(
            "GRPO + dynamic filtering",
            ("--dppo.method grpo", "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range 0 1"),
            "filter",
        ),
    )


@dataclass(frozen=True)
class Machine:
    """Where a GRPO step's time goes, as shares of it: generation ``f``, the weight sync ``fixed``; the
    rest (the experience and training phases) scales with the tokens trained."""

    f: float
    fixed: float = 0.0

    def __post_init__(self) -> None:
        if not (0.0 <= self.f <= 1.0 and 0.0 <= self.fixed <= 1.0 - self.f):
            raise ValueError(
                f"f and fixed must be shares of one step (f in [0, 1], fixed in [0, 1 - f]), got {self.f}, "
                f"{self.fixed}"
            )

    def step_ratio(self, gen: float, train: float) -> float:
        """A step's time as a share of GRPO's: fixed + f gen + (1 - f - fixed) train."""
        return self.fixed + self.f * gen + (1.0 - self.f - self.fixed) * train


@dataclass
class RunAdvice:
    run: Run
    summary: RunSummary
    shares: list[float]  # u_i of every step, in step order ([]: not logged on every step)
    machine: Machine | None  # the run's f and weight-sync share (None: no timing)
    exact_drop: bool  # the run's flags make the drop of advantage-0 completions exact
    warmup: int = 1
    notes: list[str] = field(default_factory=list)

    @property
    def mean_share(self) -> float | None:
        """The mean all-equal share over every step; None where it is not logged on every step."""
        return statistics.fmean(self.shares) if self.shares else None


def exact_drop(args: dict) -> bool:
    """Whether a DPPO run with these flags (run_config.json's ``args``) drops advantage-0 completions
    exactly: no KL (in reward or loss) or entropy term, and a group estimator without batch whitening."""
    from openrlhf_dppo.core import BATCH_WHITENED

    algo, actor = args.get("algo") or {}, args.get("actor") or {}
    kl = float(((algo.get("kl") or {}).get("init_coef")) or 0.0) > 0
    entropy = float(actor.get("entropy_coef") or 0.0) != 0
    estimator = ((algo.get("advantage") or {}).get("estimator")) or "group_norm"
    return not (kl or entropy or estimator in BATCH_WHITENED)


def run_machine(summary: RunSummary) -> Machine | None:
    """The run's f and weight-sync share (median phase / median step time); None without them."""
    f, step = summary.generation_share, summary.step_time
    if f is None or not step:
        return None
    sync = summary.phases.get(R.BROADCAST)
    return Machine(min(f, 1.0), 0.0 if sync is None else min(sync / step, 1.0 - min(f, 1.0)))


def analyse(path: str, settings: Settings) -> RunAdvice:
    """One run directory's advice (u, f, the lossless limit); raises RunDirError when unreadable."""
    run = load_run(path)
    summary = summarize(run, settings)
    logged = [R.number(r.get(R.EQUAL_REWARD_FRAC_HT)) for r in run.train]
    shares = [u for u in logged if u is not None] if run.train and None not in logged else []
    notes = []
    if not shares:
        notes.append(f"no {R.EQUAL_REWARD_FRAC_HT} on every step: no all-equal share, no projection")
    if shares and min(shares) >= 1.0:
        notes.append(f"{NO_GRADIENT}: check the reward function and the task's difficulty")
    machine = run_machine(summary)
    if machine is None:
        notes.append(f"no {R.GENERATION} / {R.STEP_TOTAL}: f is not told (give --gen-share)")
    if run.algo != "grpo":
        notes.append(
            f"a {run.algo} run: its f and phase times are of its own pruned steps, not GRPO's (advise reads "
            "best a GRPO run)"
        )
    return RunAdvice(
        run=run,
        summary=summary,
        shares=shares,
        machine=machine,
        exact_drop=exact_drop(run.config.get("args") or {}),
        warmup=settings.warmup,
        notes=[f"{run.name}: {n}" for n in notes],
    )


def default_rates(shares: list[float]) -> list[float]:
    """r_i of each step: ``core.PromptRateControl`` at ``DPPOConfig``'s defaults, fed u_1 .. u_{i-1}."""
    from openrlhf_dppo.core import DPPOConfig, PromptRateControl

    control = PromptRateControl.from_config(DPPOConfig())
    rates = []
    for u in shares:
        rates.append(control.rate())
        control.observe(u)
    return rates


def step_weights(rows: list[dict]) -> list[float]:
    """The steps' times (``timing/step_total``), or 1 each where a step lacks it."""
    times = [R.number(row.get(R.STEP_TOTAL)) for row in rows]
    known = [t for t in times if t is not None and t >= 0.0]
    return known if len(known) == len(rows) and sum(known) > 0 else [1.0] * len(rows)


@dataclass(frozen=True)
class Projection:
    """One method on one run: mean gen and train over the steps used, and the step-time ratio."""

    gen: float
    train: float
    ratio: float  # T / T_grpo, weighted by the steps' times

    @property
    def speedup(self) -> float:
        return 1.0 / self.ratio


def projection(a: RunAdvice, method: Method, machine: Machine, completion_rate: float) -> Projection | None:
    """``method`` on run ``a`` at ``machine`` (the projection of the module docstring); None without the share, or for
    dynamic filtering where every group was all equal (it would never fill a batch)."""
    if not a.shares:
        return None
    used = S.after_warmup(list(zip(a.shares, default_rates(a.shares))), a.warmup)
    weights = step_weights(S.after_warmup(a.run.train, a.warmup))
    mean_u = statistics.fmean(u for u, _ in used)
    cost = []
    for u, r in used:
        if method.kind == "grpo":
            gen, train = 1.0, 1.0
        elif method.kind == "filter":
            if mean_u >= 1.0:
                return None
            gen, train = 1.0 / (1.0 - mean_u), 1.0
        else:
            kept = 1.0 - min(u, 1.0) if a.exact_drop else 1.0
            if method.kind == "completion":
                kept = min(kept, 1.0 - completion_rate)
            gen, train = 1.0 - r, (1.0 - r) * kept
        cost.append((gen, train))
    ratio = sum(w * machine.step_ratio(g, t) for w, (g, t) in zip(weights, cost)) / sum(weights)
    return Projection(statistics.fmean(g for g, _ in cost), statistics.fmean(t for _, t in cost), ratio)
