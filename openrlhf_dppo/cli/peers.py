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
