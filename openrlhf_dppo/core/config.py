"""``DPPOConfig``: the one frozen configuration of the method, built once from the CLI's ``--dppo.*`` flags
(generated from each field's ``option(...)`` metadata, ``openrlhf_dppo.cli.flags``); core functions
never take it. Every rejection raises ``DPPOConfigError`` (field, value, what is expected).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from openrlhf_dppo.core.history import RATE_CONTROLS, ZERO_SHARE_CAP
from openrlhf_dppo.core.keep_probs import PROMPT_POLICIES

SHORT_BATCH_RULES = ("drop", "train")
#: the values of --dppo.method (each branch tests ``method == "<name>"``)
METHODS = ("grpo", "dppo", "greso", "cppo")


class DPPOConfigError(ValueError):
    """``field`` (the flag is ``--dppo.<field>``), ``value`` given, ``reason`` what is expected."""

    def __init__(self, field: str, value, reason: str) -> None:
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"--dppo.{field} {value!r}: {reason}")


def option(default, help: str, choices=None, default_text: str | None = None):
    """A dataclass field that is also a ``--dppo.<name>`` flag. choices: a ``Registry``, a tuple of
    names or None; default_text: how the default is shown when it is not a plain value."""
    return dataclasses.field(
        default=default, metadata={"help": help, "choices": choices, "default_text": default_text}
    )


def field_choices(field: dataclasses.Field) -> list[str] | None:
    """The valid names of a field built by ``option``, in their order."""
    source = field.metadata.get("choices")
    return None if source is None else list(source)


@dataclass(frozen=True)
class DPPOConfig:
    """DPPO settings (docs/METHOD.md); each field's meaning is its ``help`` metadata. Rates are pruning
    rates: the keep fraction is 1 - rate."""

    method: str = option(
        "dppo",
        "the training method: grpo: OpenRLHF's GRPO (its samples generator, experience maker and training "
        "step), with group statistics in float64, an evaluation before step 1 when evaluation is on, the run "
        "directory, every micro-batch of an optimizer step applied under ZeRO-1/2 with dynamic batches (OpenRLHF's "
        "loop applies the last one's gradient alone), and without --train.dynamic_batch_enable a rank's "
        "partial last micro-batch refused; dppo: "
        "DPPO, prompt and completion pruning by the --dppo.* settings that follow; greso: GRESO, biased by "
        "design as published: prompts skipped before the rollout on their runs of all-equal groups, no "
        "reweighting, GRPO's training step; needs --algo.dynamic_filtering_enable; cppo: CPPO, biased by design as "
        "published: int(B / (1 - P)) prompts rolled out, the G - int(G P) completions of largest |A| of each "
        "group trained at weight 1 (P = --dppo.completion_prune_rate, > 0), GRPO's update size; the prompt-level "
        "flags and --dppo.p_min do not apply",
        choices=METHODS,
    )
    prompt_prune_rate: float = option(
        0.5,
        "fraction of the drawn prompts pruned before rollout, in [0, 1); under --dppo.prompt_rate_control "
        f"zero-share the rate of the first draw only, at most {ZERO_SHARE_CAP}",
    )
    prompt_rate_control: str = option(
        "zero-share",
        "the prune rate of each prompt draw: fixed: --dppo.prompt_prune_rate; zero-share: a moving "
        "average of the share of drawn prompts whose G rewards were all equal (no gradient), capped at "
        f"{ZERO_SHARE_CAP}, set from earlier steps only",
        choices=RATE_CONTROLS,
    )
    prompt_policy: str = option(
        "proportional",
        "prompt keep probabilities at the rate's budget: proportional: q = clip(c s, q_min, 1) over the "
        "history's score s (an unseen prompt takes the mean seen score); uniform: q = 1 - rate for every "
        "prompt (the equal-cost control)",
        choices=PROMPT_POLICIES,
    )
    completion_prune_rate: float = option(
        0.0,
        "fraction of the rolled-out completions pruned before the actor / reference forward passes, in "
        "[0, 1): those with |A| below the batch mean at one rate, the rest kept",
    )
    q_min: float = option(
        0.1,
        "floor of every prompt keep probability, in (0, 1], at most 1 - --dppo.prompt_prune_rate "
        f"(zero-share: at most {1 - ZERO_SHARE_CAP:g})",
    )
    p_min: float = option(
        0.1,
        "floor of every completion keep probability whose gradient may be non-zero, in (0, 1], at most "
        "1 - --dppo.completion_prune_rate",
    )
    seed: int = option(
        42,
        "seed of the pruning draws; draw k and step t use streams (seed, k) and (seed, t), so a resumed "
        "run repeats them",
    )
    short_batch: str = option(
        "drop",
        "a rollout batch smaller than one --train.batch_size batch (an epoch's short last batch): drop: "
        "not trained (OpenRLHF's rule; counted as samples|tokens/untrained); train: one optimizer step, "
        "and the LR schedule spans these steps. Both arms; a batch of fewer rollouts than data-parallel "
        "ranks is never trained",
        choices=SHORT_BATCH_RULES,
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            valid = field_choices(f)
            if valid is not None and getattr(self, f.name) not in valid:
                _reject(f.name, getattr(self, f.name), f"expected one of: {', '.join(valid)}")
        for name in ("prompt_prune_rate", "completion_prune_rate"):
            v = getattr(self, name)
            if not _is_real(v) or not 0.0 <= v < 1.0:
                _reject(
                    name, v, "expected a rate in [0, 1): it is the fraction pruned, 1 would prune everything"
                )
        for name in ("q_min", "p_min"):
            v = getattr(self, name)
            if not _is_real(v) or not 0.0 < v <= 1.0:
                _reject(
                    name, v, "expected a value in (0, 1]: a keep probability of 0 can never be corrected for"
                )
        if not _is_int(self.seed):
            _reject("seed", self.seed, "expected an integer")
        zero_share = self.prompt_rate_control == "zero-share"
        if zero_share and self.prompt_prune_rate > ZERO_SHARE_CAP + 1e-12:
            _reject(
                "prompt_prune_rate",
                self.prompt_prune_rate,
                f"expected at most {ZERO_SHARE_CAP} under --dppo.prompt_rate_control zero-share, whose rates "
                "(the first draw's included) are capped there",
            )
        top = ZERO_SHARE_CAP if zero_share else self.prompt_prune_rate
        if self.q_min > 1.0 - top + 1e-12:
            rate = "zero-share's highest rate" if zero_share else "--dppo.prompt_prune_rate"
            _reject(
                "q_min",
                self.q_min,
                f"expected at most 1 - {rate} = {1 - top:g}: the floor alone would keep more prompts than "
                "the budget",
            )
        if self.method == "cppo" and self.completion_prune_rate <= 0:
            _reject(
                "completion_prune_rate",
                self.completion_prune_rate,
                "expected a rate in (0, 1) under --dppo.method cppo: CPPO prunes each group's completions of "
                "smallest |A| at this rate and draws int(B / (1 - rate)) prompts (the paper's 0.5)",
            )
        if self.method != "cppo" and self.p_min > 1.0 - self.completion_prune_rate + 1e-12:
            _reject(
                "p_min",
                self.p_min,
                f"expected at most 1 - --dppo.completion_prune_rate = {1 - self.completion_prune_rate:g}: "
                "the floor alone would keep more completions than the budget",
            )

    def notices(self) -> list[str]:
        """What these settings leave unpruned that a user may not expect, one line each (printed at start)."""
        fixed = self.prompt_rate_control == "fixed"
        unpruned = fixed and self.prompt_prune_rate == 0 and self.completion_prune_rate == 0
        if self.method == "cppo":
            return [
                "CPPO (biased by design) rolls out int(--rollout.batch_size / (1 - --dppo.completion_prune_rate)) "
                "prompts a step and trains each group's completions of largest |A| at weight 1; "
                "--dppo.prompt_prune_rate, --dppo.prompt_rate_control, --dppo.prompt_policy, --dppo.q_min and "
                "--dppo.p_min do not apply"
            ]
        if self.method == "dppo" and unpruned:
            return [
                "DPPO prunes no prompt and no completion at these settings (only completions of advantage 0, "
                "exactly, when no KL or entropy term moves them): set --dppo.prompt_prune_rate or "
                "--dppo.completion_prune_rate, or drop --dppo.prompt_rate_control fixed"
            ]
        return []

    @property
    def prompt_keep_frac(self) -> float:
        return 1.0 - self.prompt_prune_rate

    @property
    def completion_keep_frac(self) -> float:
        return 1.0 - self.completion_prune_rate

    @classmethod
    def from_namespace(cls, ns) -> DPPOConfig:
        """From an argparse-like namespace, its ``dppo`` attribute, or a dict; other keys are ignored,
        missing fields take their defaults; an old run's ``enable`` (no ``method``) is dppo/grpo."""
        if not isinstance(ns, dict) and hasattr(ns, "dppo"):
            ns = ns.dppo
        values = dict(ns if isinstance(ns, dict) else vars(ns))
        if "method" not in values and isinstance(values.get("enable"), bool):
            values["method"] = "dppo" if values["enable"] else "grpo"
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
