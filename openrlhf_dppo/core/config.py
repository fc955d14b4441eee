"""``DPPOConfig``: the one frozen configuration of the method, built once at the boundary (the CLI's
``--dppo.*`` flags) and passed on as plain values; core functions never take it.

Each field's help text and the source of its choices (a ``Registry`` or a tuple, read when asked, so a
newly registered name is a valid choice at once) are written once, in the field's metadata
(``option(...)``); a registry-backed field's help lists the entries with their own help (``describe``). The CLI's ``--dppo.*`` group, its ``--help`` and the README's flag table are
generated from them (``openrlhf_dppo.cli.flags``). Every rejection raises ``DPPOConfigError``, which
carries the field, the value and the reason.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from openrlhf_dppo.core.history import REWARD_KINDS, UNSEEN_RULES
from openrlhf_dppo.core.keep_probs import COMPLETION_POLICIES, PROMPT_POLICIES
from openrlhf_dppo.core.packing import PACKERS
from openrlhf_dppo.core.rate_control import RATE_CONTROLS
from openrlhf_dppo.core.sampling import SAMPLING_DESIGNS
from openrlhf_dppo.core.weights import TOKEN_NORMALIZERS

PROMPT_BATCH_MODES = ("shrink", "refill")
SHORT_BATCH_RULES = ("drop", "train")
UNSEEN_PROMPT_RULES = UNSEEN_RULES  # PromptHistory.signals' unseen rules
#: --dppo.mode: a name for a set of flags. ``custom``: the flags as given; a preset sets the fields below that
#: the command line leaves unset, where its other flags accept the value (``cli.flags.apply_mode``, the rule of
#: the mode's help); run_config.json's argv records what it set, as flags in front of the command line.
MODE_PRESETS = {
    "custom": {},
    # the closest to GRPO's final held-out accuracy in the least training time on both CPU tasks
    # (benchmarks/RESULTS.md, "Current results"): the prune rate follows the measured share of groups
    # without gradient, unseen prompts are drawn too (the first epoch is pruned), no completion pruning
    # beyond the exact A == 0 drop
    "recommended": {
        "prompt_rate_control": "zero-share",
        "prompt_prune_rate": 0.5,
        "unseen_prompts": "mean",
        "completion_prune_rate": 0.0,
    },
}


class DPPOConfigError(ValueError):
    """A field value the method cannot run with. ``field`` is the field's name (the flag is
    ``--dppo.<field>``), ``value`` what was given, ``reason`` why it is refused."""

    def __init__(self, field: str, value, reason: str) -> None:
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"dppo.{field}={value!r} {reason}")


def option(default, help: str, choices=None, default_text: str | None = None):
    """A dataclass field that is also a ``--dppo.<name>`` flag.

    help: the one description of the field (``--help``, README).  choices: a ``Registry`` or a tuple
    of valid names, or None.  default_text: how the default is shown when it is not a plain value.
    """
    return dataclasses.field(
        default=default, metadata={"help": help, "choices": choices, "default_text": default_text}
    )


def field_choices(field: dataclasses.Field) -> list[str] | None:
    """The valid names of a field built by ``option`` (registry order: sorted; tuple order: as written)."""
    source = field.metadata.get("choices")
    return None if source is None else list(source)


@dataclass(frozen=True)
class DPPOConfig:
    """DPPO settings (METHOD.md). Rates are pruning rates: the keep fraction is 1 - rate. The meaning
    of each field is its ``help`` metadata (``python -m openrlhf_dppo.cli.flags_table`` prints them)."""

    enable: bool = option(
        True,
        "true: DPPO; false: OpenRLHF's GRPO run (OpenRLHF's samples generator, experience maker, actor "
        "training step and, under --dppo.short_batch drop, its whole-train-batch rule). What differs from "
        "OpenRLHF alone: group statistics in float64 as DPPO's (a group of equal rewards gets advantage 0 "
        "exactly), an evaluation before step 1 when evaluation is on, the run-directory files, and without "
        "--train.dynamic_batch_enable a rank's partial last micro-batch is refused where OpenRLHF drops it",
    )
    mode: str = option(
        "custom",
        "a named flag set: custom = the --dppo.* flags as given; recommended = --dppo.prompt_rate_control "
        "zero-share --dppo.prompt_prune_rate 0.5 --dppo.unseen_prompts mean --dppo.completion_prune_rate 0 "
        "(the best time to GRPO's accuracy on both CPU tasks; the first epoch is pruned too). A preset sets "
        "only what the command line leaves unset (a flag it gives wins, abbreviated or not), and never makes "
        "its flags fail: a preset value they would refuse (e.g. a rate above --dppo.prompt_prune_rate_max) "
        "is left out, the field keeping its default, and the start-up line says so; under --dppo.enable "
        "false (GRPO) it sets nothing",
        choices=tuple(MODE_PRESETS),
    )
    prompt_prune_rate: float = option(
        0.0,
        "target fraction r_q of the drawn prompts pruned before rollout (never generated), in [0, 1); "
        "under --dppo.prompt_rate_control zero-share the rate of the first draw only",
    )
    prompt_rate_control: str = option(
        "fixed",
        "the prune rate of each prompt draw: fixed = --dppo.prompt_prune_rate; zero-share = the share of "
        "the drawn prompts whose G rewards were all equal (no gradient: rollout/equal_reward_frac_ht), "
        "a moving average over the past steps, capped at --dppo.prompt_prune_rate_max, with "
        "--dppo.prompt_prune_rate until a step was measured (still unbiased: fixed before the rollout; "
        "needs --dppo.prompt_batch shrink)",
        choices=RATE_CONTROLS,
    )
    prompt_policy: str = option(
        "proportional",
        "prompt keep probabilities, one policy per module of core/prompt_policies/ (every policy spends the "
        "rate --dppo.prompt_rate_control sets and is drawn and weighted 1/q alike): "
        + PROMPT_POLICIES.describe(),
        choices=PROMPT_POLICIES,
    )
    prompt_prune_rate_max: float = option(
        0.7,
        "with --dppo.prompt_rate_control zero-share: the highest prune rate it sets, in [0, 1), at least "
        "--dppo.prompt_prune_rate and at most 1 - q_min",
    )
    completion_prune_rate: float = option(
        0.0,
        "target fraction r_o of the rolled-out completions pruned before the actor / reference forward "
        "passes, in [0, 1)",
    )
    completion_policy: str = option(
        "uniform-low",
        "completion keep probabilities, one policy per module of core/policies/: "
        + COMPLETION_POLICIES.describe(),
        choices=COMPLETION_POLICIES,
    )
    q_min: float = option(
        0.1,
        "floor of every prompt keep probability, in (0, 1] and at most 1 - r_q; > 0 keeps the estimator "
        "unbiased",
    )
    p_min: float = option(
        0.1,
        "floor of every completion keep probability whose gradient may be non-zero, in (0, 1] and at most "
        "1 - r_o",
    )
    sampling: str = option(
        "systematic",
        "sampling design of both masks: " + SAMPLING_DESIGNS.describe(),
        choices=SAMPLING_DESIGNS,
    )
    packer: str = option(
        "window",
        "micro-batch packer under --train.max_tokens_per_gpu: " + PACKERS.describe(),
        choices=PACKERS,
    )
    pack_window: int = option(8, "open buffers of the window packer, >= 1")
    seed: int = option(
        42,
        "seed of the pruning draws; the prompt draw k and the completion draw of step t use their own "
        "streams of (seed, k) and (seed, t), so a resumed run repeats them",
    )
    history_decay: float = option(
        0.5, "per-rollout decay of a prompt's success / reward-variance statistics, in [0, 1)"
    )
    history_prior: float = option(1.0, "Beta(prior, prior) pseudo-count of the success estimate, > 0")
    reward_kind: str = option(
        "auto",
        "prompt score: binary P(G samples not all equal), continuous the estimated reward std, auto "
        "binary while every reward seen is 0 or 1",
        choices=REWARD_KINDS,
    )
    unseen_prompts: str = option(
        "keep",
        "keep probability of a prompt never rolled out: keep = always kept (q = 1, the rule of "
        "openrlhf_dppo/core/__init__.py, item 2: the first epoch prunes no prompt); mean = scored like an average seen prompt (the mean score over "
        "every prompt the history has seen, 1 before any) and drawn at the target rate with the rest, "
        "so the first epoch is pruned too (still unbiased: q > 0 and fixed before the rollout)",
        choices=UNSEEN_PROMPT_RULES,
    )
    prompt_batch: str = option(
        "shrink",
        "shrink: a step rolls out only the kept prompts (a smaller, cheaper step); refill: floor(B / (1 - "
        "r_q)) prompts are drawn and every kept one is rolled out and trained in that step (about B = "
        "--rollout.batch_size once the prompts are known, up to floor(B / (1 - r_q)) while most are unseen "
        "unless --dppo.unseen_prompts mean, "
        "always in GRPO's number of optimizer steps; needs --dppo.sampling systematic)",
        choices=PROMPT_BATCH_MODES,
    )
    drop_zero_advantage: bool = option(
        True,
        "completions with A == 0 exactly get p = 0 (exact and free); applied only when no KL term (in "
        "reward or loss) and no entropy term can give them a gradient",
    )
    token_normalizer: str = option(
        "ht",
        "token-mean normaliser Z: ht = sum over rolled-out prompts of (1/q_j) x (response tokens of all G "
        "completions), exact without prompt pruning and consistent with it; constant = B x G x "
        "--rollout.max_new_tokens (--data.max_len when unset; Dr.GRPO style, exactly unbiased)",
        choices=TOKEN_NORMALIZERS,
    )
    prompt_log: bool = option(
        False,
        "true: append each step's rolled-out groups (dataset index, keep probability q, raw rewards, "
        "response lengths) to prompts.jsonl in the run directory, DPPO on or off: the data of "
        "`openrlhf-dppo advise`, which replays the prompt selection rules on it",
    )

    short_batch: str = option(
        "drop",
        "with packed micro-batches (--train.dynamic_batch_enable; always on for DPPO) a rollout batch makes "
        "as many optimizer steps as it holds whole --train.batch_size batches, in both arms (GRPO leaves "
        "what they leave untrained; DPPO spreads its kept rollouts over those steps); drop (OpenRLHF's "
        "rule): a batch smaller than one train batch (an epoch's short last batch) is not trained, counted "
        "as samples|tokens/untrained; train: such a batch (every batch when B x G is smaller than one train "
        "batch) is one optimizer step, and the LR schedule spans these steps; under either rule a batch of "
        "fewer rollouts than data-parallel ranks is not trained (it cannot be spread over them; counted as "
        "untrained)",
        choices=SHORT_BATCH_RULES,
    )

    def __post_init__(self) -> None:
        for name in ("enable", "drop_zero_advantage", "prompt_log"):
            if not isinstance(getattr(self, name), bool):
                _reject(name, getattr(self, name), "must be a bool (true/false)")
        for name in ("prompt_prune_rate", "completion_prune_rate"):
            v = getattr(self, name)
            if not _is_real(v) or not 0.0 <= v < 1.0:
                _reject(name, v, "must be in [0, 1): it is the fraction pruned, and 1 would prune everything")
        if not _is_real(self.prompt_prune_rate_max) or not 0.0 <= self.prompt_prune_rate_max < 1.0:
            _reject("prompt_prune_rate_max", self.prompt_prune_rate_max, "must be a prune rate in [0, 1)")
        for name in ("q_min", "p_min"):
            v = getattr(self, name)
            if not _is_real(v) or not 0.0 < v <= 1.0:
                _reject(name, v, "must be in (0, 1]: a keep probability of 0 can never be corrected for")
        if self.q_min > 1.0 - self.prompt_prune_rate + 1e-12:
            _reject(
                "q_min",
                self.q_min,
                f"exceeds the prompt keep fraction 1 - prompt_prune_rate = {1 - self.prompt_prune_rate:g}: "
                "the floor alone would keep more prompts than the budget",
            )
        if self.p_min > 1.0 - self.completion_prune_rate + 1e-12:
            _reject(
                "p_min",
                self.p_min,
                f"exceeds the completion keep fraction 1 - completion_prune_rate = "
                f"{1 - self.completion_prune_rate:g}: the floor alone would keep more than the budget",
            )
        for f in dataclasses.fields(self):
            valid = field_choices(f)
            if valid is not None and getattr(self, f.name) not in valid:
                _reject(f.name, getattr(self, f.name), f"is not one of: {', '.join(valid)}")
        if self.prompt_rate_control == "zero-share":
            self._check_controlled_rate()
        if not _is_int(self.pack_window) or self.pack_window < 1:
            _reject("pack_window", self.pack_window, "must be an integer >= 1 (number of open bins)")
        if not _is_int(self.seed):
            _reject("seed", self.seed, "must be an integer")
        if not _is_real(self.history_decay) or not 0.0 <= self.history_decay < 1.0:
            _reject("history_decay", self.history_decay, "must be in [0, 1): the weight kept by the past")
        if not _is_real(self.history_prior) or not self.history_prior > 0:
            _reject("history_prior", self.history_prior, "must be > 0 (Beta prior pseudo-count)")

    def _check_controlled_rate(self) -> None:
        cap = self.prompt_prune_rate_max
        if self.prompt_prune_rate > cap + 1e-12:
            _reject(
                "prompt_prune_rate",
                self.prompt_prune_rate,
                f"exceeds --dppo.prompt_prune_rate_max {cap:g}: under --dppo.prompt_rate_control zero-share it "
                "is the rate of the first draw, which the cap bounds like every other",
            )
        if self.q_min > 1.0 - cap + 1e-12:
            _reject(
                "q_min",
                self.q_min,
                f"exceeds 1 - prompt_prune_rate_max = {1 - cap:g}: zero-share may prune up to that cap, and the "
                "floor alone would then keep more prompts than the budget",
            )
        if self.prompt_batch != "shrink":
            _reject(
                "prompt_rate_control",
                self.prompt_rate_control,
                f"needs --dppo.prompt_batch shrink (got {self.prompt_batch}): refill sizes its draw from a fixed "
                "rate, floor(B / (1 - r_q))",
            )

    def notices(self) -> list[str]:
        """What these settings leave unpruned that a user may not expect, one line each (printed at start)."""
        if not self.enable:
            return []
        out = []
        prompts = self.prompt_rate_control == "zero-share" or self.prompt_prune_rate > 0
        if not prompts and self.completion_prune_rate == 0:
            out.append(
                "DPPO prunes no prompt and no completion at these settings (only completions of advantage 0, "
                "exactly, when no KL or entropy term moves them): --dppo.mode recommended, or set "
                "--dppo.prompt_prune_rate / --dppo.completion_prune_rate"
            )
        if prompts and self.unseen_prompts == "keep":
            out.append(
                "--dppo.unseen_prompts keep: a prompt is kept (q = 1) until the history has seen it, so the first "
                "epoch prunes no prompt (a run of about one epoch almost none); --dppo.unseen_prompts mean prunes "
                "it too"
            )
        return out

    @property
    def prompt_keep_frac(self) -> float:
        return 1.0 - self.prompt_prune_rate

    @property
    def completion_keep_frac(self) -> float:
        return 1.0 - self.completion_prune_rate

    def prompts_drawn(self, batch_size: int) -> int:
        """Prompts drawn per step for ``--rollout.batch_size`` B: B (shrink), floor(B / (1 - r_q)) (refill).

        Every kept prompt of the draw is rolled out in its step: about B with refill once the history
        knows the prompts (exactly round(sum q) with systematic sampling), but up to the whole draw while
        they are unseen (q = 1: all of epoch 1, unless ``unseen_prompts`` is mean). The optimizer steps
        per step stay GRPO's (from B)."""
        if self.prompt_batch == "refill" and self.prompt_keep_frac < 1.0:
            return max(batch_size, math.floor(batch_size / self.prompt_keep_frac + 1e-9))
        return batch_size

    @classmethod
    def from_namespace(cls, ns) -> DPPOConfig:
        """Build from an argparse-like namespace (or a dict). If ``ns`` has a ``dppo`` attribute (the
        nested OpenRLHF-style args), that is used. Keys that are not fields are ignored; missing
        fields take their defaults."""
        if not isinstance(ns, dict) and hasattr(ns, "dppo"):
            ns = ns.dppo
        values = ns if isinstance(ns, dict) else vars(ns)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names and v is not None})

    def asdict(self) -> dict:
        return dataclasses.asdict(self)


def _is_real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _reject(name: str, value, why: str) -> None:
    raise DPPOConfigError(name, value, why)
