"""Are two runs comparable? A diff of their run_config.json: every OpenRLHF argument (``args``, flattened
to dotted keys) but ``dppo.*`` and the per-run ones, grouped into categories; differences in a category of
``NOT_BREAKING`` are reported without breaking comparability (docs/REPORT.md, "Warnings")."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from openrlhf_dppo import run_dir as R

SEED_KEYS = ("train.seed", "dppo.seed")  # what tells the seeds of one arm apart
# keys that differ between any two runs by construction
IGNORED_KEYS = frozenset({"ckpt.output_dir", "ckpt.path", "local_rank"})
IGNORED_PREFIXES = ("dppo.", "logger.")

CATEGORIES = {
    "model": ("actor.model_name_or_path", "reward.model_name_or_path", "critic.model_name_or_path"),
    "data": ("data.", "eval.dataset", "eval.split"),
    "group size": ("rollout.n_samples_per_prompt",),
    "seeds": ("train.seed",),
}
HARDWARE_KEYS = ("cpu", "num_cpus", "gpus", "num_gpus")
# DPPO's trainer turns on dynamic batching, and with it OpenRLHF's packing, token budget and kernel
SET_BY_DPPO = frozenset(
    {
        "train.dynamic_batch_enable",
        "ds.packing_samples",
        "rollout.max_tokens_per_gpu",
        "ds.attn_implementation",
    }
)
SET_BY_DPPO_CATEGORY = "packing (set by DPPO)"
# GRESO (--dppo.method greso) runs only with dynamic filtering: between it and GRPO, the method's own
NEEDED_BY_GRESO = frozenset({"algo.dynamic_filtering_enable", "algo.dynamic_filtering_range"})
NEEDED_BY_GRESO_CATEGORY = "dynamic filtering (GRESO's)"
PRECISION_CATEGORY = "precision"  # machine.precision: breaks comparability
MACHINE_CATEGORY = "machine"  # the other machine fields: times come from two machines
CONTROL_CATEGORY = "control (by design)"
NOT_BREAKING = frozenset({SET_BY_DPPO_CATEGORY, NEEDED_BY_GRESO_CATEGORY, MACHINE_CATEGORY, CONTROL_CATEGORY})


@dataclass(frozen=True)
class Difference:
    category: str  # a CATEGORIES key, hardware, other OpenRLHF args or a *_CATEGORY
    key: str
    baseline: Any
    other: Any

    @property
    def breaks_comparison(self) -> bool:
        """False for the categories in ``NOT_BREAKING`` (module docstring)."""
        return self.category not in NOT_BREAKING


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; keys that already contain dots are kept as they are."""
    if not isinstance(tree, dict):
        return {prefix: tree} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, full))
        else:
            out[full] = value
    return out


def _category(key: str, dppo_vs_grpo: bool, greso_vs_grpo: bool = False) -> str:
    if dppo_vs_grpo and key in SET_BY_DPPO:
        return SET_BY_DPPO_CATEGORY
    if greso_vs_grpo and key in NEEDED_BY_GRESO:
        return NEEDED_BY_GRESO_CATEGORY
    for name, patterns in CATEGORIES.items():
        if any(key == p or (p.endswith(".") and key.startswith(p)) for p in patterns):
            return name
    return "other OpenRLHF args"


def is_run_specific(key: str) -> bool:
    """Keys that differ between any two runs (output directories, logger names), DPPO's included."""
    return key in IGNORED_KEYS or key.startswith("logger.") or key.endswith("run_dir")


def _ignored(key: str) -> bool:
    return is_run_specific(key) or key.startswith(IGNORED_PREFIXES)


def config_differences(baseline: dict[str, Any], other: dict[str, Any]) -> list[Difference]:
    """Differences between two run_config.json dicts that make a speedup questionable."""
    diffs = []
    # CPPO trains through DPPO's packed plan too: the same packing args are set for it
    dppo_vs_grpo = {baseline.get("algo"), other.get("algo")} in ({"dppo", "grpo"}, {"cppo", "grpo"})
    greso_vs_grpo = {baseline.get("algo"), other.get("algo")} == {"greso", "grpo"}
    a, b = flatten(baseline.get("args") or {}), flatten(other.get("args") or {})
    for key in sorted(set(a) | set(b)):
        if _ignored(key):
            continue
        va, vb = a.get(key, "<absent>"), b.get(key, "<absent>")
        if va != vb:
            diffs.append(Difference(_category(key, dppo_vs_grpo, greso_vs_grpo), key, va, vb))
    ha, hb = baseline.get("hardware") or {}, other.get("hardware") or {}
    for key in HARDWARE_KEYS:
        if ha.get(key) != hb.get(key):
            diffs.append(Difference("hardware", f"hardware.{key}", ha.get(key), hb.get(key)))
    diffs += machine_differences(baseline, other)
    order = [*CATEGORIES, "hardware", PRECISION_CATEGORY, "other OpenRLHF args", SET_BY_DPPO_CATEGORY]
    order.append(NEEDED_BY_GRESO_CATEGORY)
    order.append(MACHINE_CATEGORY)
    return sorted(diffs, key=lambda d: (order.index(d.category), d.key))


def arm_differences(baseline: dict[str, Any], other: dict[str, Any]) -> list[Difference]:
    """:func:`config_differences` without the seeds: what two arms (or two seeds of one arm) should
    not differ in."""
    return [d for d in config_differences(baseline, other) if d.key not in SEED_KEYS]


def arm_key(config: dict[str, Any]) -> str:
    """What makes two runs one arm: the config without seeds, per-run paths and logger names."""
    args = flatten(config.get("args") or {})
    key = {k: v for k, v in args.items() if k not in SEED_KEYS and not is_run_specific(k)}
    key.update({f"dppo_config.{k}": v for k, v in (config.get("dppo") or {}).items() if k != "seed"})
    key["algo"] = config.get("algo")
    return json.dumps(key, sort_keys=True, default=str)


def by_design(differences: list[Difference], keys: frozenset[str]) -> list[Difference]:
    """``differences`` with those in ``keys`` (what a control arm is designed to differ in) moved to
    ``CONTROL_CATEGORY``; every other difference as it was."""
    return [replace(d, category=CONTROL_CATEGORY) if d.key in keys else d for d in differences]


def machine_of(config: dict[str, Any]) -> dict[str, Any] | None:
    """run_config.json's machine record; None when the run did not record it."""
    machine = config.get(R.MACHINE)
    return machine if isinstance(machine, dict) else None


def machine_differences(baseline: dict[str, Any], other: dict[str, Any]) -> list[Difference]:
    """The machine fields two run configs differ in ([] when either did not record its machine)."""
    a, b = machine_of(baseline), machine_of(other)
    if a is None or b is None:
        return []
    return [
        Difference(
            PRECISION_CATEGORY if key == R.MACHINE_PRECISION else MACHINE_CATEGORY,
            f"{R.MACHINE}.{key}",
            a.get(key, "<absent>"),
            b.get(key, "<absent>"),
        )
        for key in R.MACHINE_FIELDS
        if a.get(key, "<absent>") != b.get(key, "<absent>")
    ]
