"""What the peer methods of ``--dppo.method`` need from OpenRLHF's flags (docs/FLAGS.md), checked by
``cli.validate`` before Ray starts: each check returns (the flag to name, why) for a command the method
cannot run with, or None. Imports no host module."""

from __future__ import annotations


def greso_refusal(flags: dict) -> tuple[str, str] | None:
    """``--dppo.method greso``: dynamic filtering refills the batch GRESO's skips leave short (its
    replacement prompts pass the same skip); its streaks read the rewards as each group comes back; its
    skip runs in the synchronous trainer's samples generator only."""
    if not flags["algo.dynamic_filtering_enable"]:
        return (
            "--algo.dynamic_filtering_enable",
            "--dppo.method greso needs it: dynamic filtering refills the batch to --rollout.batch_size "
            "accepted groups after GRESO's skips (its replacement prompts pass the same skip). Add "
            "--algo.dynamic_filtering_enable (with --algo.dynamic_filtering_range, e.g. 0.01 0.99).",
        )
    if flags["train.async_enable"]:
        return (
            "--train.async_enable",
            "not with --dppo.method greso: GRESO's skip and streaks run in the synchronous trainer only.",
        )
    if not flags["reward.remote_url"] and not flags["train.agent_func_path"]:
        return (
            "--reward.remote_url",
            "--dppo.method greso needs the rewards on the rollouts (its per-prompt streaks read them as each "
            "group comes back): pass --reward.remote_url <reward function .py file or http(s) URL> or "
            "--train.agent_func_path <agent .py file>.",
        )
    return None


def cppo_refusal(flags: dict, prune_rate: float) -> tuple[str, str] | None:
    """``--dppo.method cppo`` (beyond DPPO's requirements, which it shares): its larger draw and keep rule
    run in the synchronous trainer only; a rate that prunes no completion of a group is no CPPO."""
    from openrlhf_dppo.core.cppo import cppo_kept_per_group

    if flags["train.async_enable"]:
        return (
            "--train.async_enable",
            "not with --dppo.method cppo: CPPO's larger prompt draw and its keep rule run in the synchronous "
            "trainer only. Drop --train.async_enable, or run --dppo.method dppo or grpo asynchronously.",
        )
    G = flags["rollout.n_samples_per_prompt"]
    if G - cppo_kept_per_group(G, prune_rate) == 0:
        return (
            "--dppo.completion_prune_rate",
            f"{prune_rate}: CPPO prunes int(G x rate) completions of each group, 0 for "
            f"--rollout.n_samples_per_prompt {G}; it would prune nothing and still draw int(B / (1 - rate)) "
            f"prompts. Use a rate of at least 1 / G = {1 / G:g} (the paper's 0.5).",
        )
    return None
