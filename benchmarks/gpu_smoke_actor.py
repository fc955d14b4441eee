"""GPU smoke, stage (d): OpenRLHF's actor trainer with the DPPO adapters and DeepSpeed, on synthetic
experiences, in one process (world size 1), without Ray actors and without vLLM.

What runs is the real policy-actor path of a training step, minus generation:
1. a random Qwen3 causal LM (``--size``: the dimensions of ``benchmarks/gpu_actor.py``'s sizes,
   ``--layers`` to cut the depth) saved with the repository's tiny tokenizer;
2. the arguments of ``openrlhf_dppo.cli.train_dppo_ray`` (OpenRLHF's parser and validation with the
   DPPO flags): ZeRO-3, packed dynamic batches, KL in the loss (k3), so the adapters' weighted
   auxiliary loss runs too (the swapped ``aggregate_loss``, which an entropy term would go through as
   well). No entropy term: OpenRLHF ``torch.compile``s its entropy in each process (11.7 s of this
   script's 41 s on CPU, more on a first CUDA compile), and tests/e2e/test_matrix.py trains with one;
3. ``DPPOPolicyModelActor.init_model_from_pretrained`` (OpenRLHF's DeepSpeed strategy, its ``Actor``,
   the optimizer and scheduler, ``DPPOActorTrainer`` with the DPPO replay buffer), then per arm
   ``append`` and ``fit`` (OpenRLHF's ``ppo_train``: the experiences go to the training device, then
   ``training_step`` per micro-batch);
4. arm ``grpo``: B x G sequences without a plan (what ``--dppo.method grpo`` trains: OpenRLHF's
   dynamic batches); arm ``dppo``: a seeded half of them with sample weight 2 folded into the
   advantages and the dispatch plan of ``openrlhf_dppo.adapters.dispatch.build_dispatch`` (full-batch
   normalisers).
Checked per arm (the JSON's ``checks``; any False fails the run, exit status 1): the losses and the
gradient norm are finite and the norm is positive; ``samples/trained`` and ``tokens/trained`` equal the
sequences and action tokens fed, and the micro-batches ``training_step`` received hold each of them
once (plus the plan's zero-weight fillers); the optimizer steps DeepSpeed took equal the plan's (GRPO:
B x G / ``--train.batch_size``); every micro-batch reached ``training_step`` on the training device.

Departures from a user's run, none in DPPO's code: no reference model (its log-probs are the actor's,
shifted per token, so the KL is not 0); a constant learning rate (a warm-up's first step has lr 0);
without a real flash-attn, ``sdpa`` instead of the
``flash_attention_2`` that packing asks for (transformers' sdpa isolates the packed sequences by their
restarting position ids; the CPU layer does the same); the vLLM weight-sync backend is ``gloo`` (there
is no engine; ``nccl`` would import vLLM for a version check). ``--optimizer torch`` (default) makes
DeepSpeed's AdamW the plain torch one (``torch_adam``); ``--optimizer fused`` keeps OpenRLHF's choice,
DeepSpeed's FusedAdam, whose CUDA kernel DeepSpeed compiles at first use (nvcc + ninja): its build time
is reported as ``fused_adam_build_s``.

On CPU (``--device cpu``: gloo, ``DS_ACCELERATOR=cpu``, the CPU layer's Ray-worker patches, fp32, and
no DeepSpeed shared-memory all-reduce op, a C++ build that one rank never uses) the same path runs,
which is how CI tests this script; the CPU patches keep the experiences on the CPU, so
only a CUDA run checks the devices.

Usage: python benchmarks/gpu_smoke_actor.py --device cuda --json out.json
       python benchmarks/gpu_smoke_actor.py --device cpu --size tiny --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

ARM_NAMES = ("grpo", "dppo")
# per size: prompts B, completions G, prompt / response length ranges, token budget per micro-batch
SHAPES = {
    "tiny": dict(prompts=8, group=4, prompt=(4, 12), response=(2, 24), max_tokens=96),
    "qwen3-0.6b": dict(prompts=8, group=8, prompt=(32, 256), response=(16, 768), max_tokens=4096),
}
KL_COEF, KEEP_PROB = 0.01, 0.5


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--size", choices=sorted(SHAPES), default="qwen3-0.6b")
    ap.add_argument("--layers", type=int, help="override the size's layer count")
    ap.add_argument("--optimizer", choices=["torch", "fused"], default="torch", help="see the docstring")
    ap.add_argument("--arms", nargs="+", choices=ARM_NAMES, default=list(ARM_NAMES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", help="where the random model is saved (default: a temporary folder)")
    ap.add_argument("--json", help="write the settings, timings and checks to this file")
    args = ap.parse_args(argv)
    if args.layers is not None and args.layers < 1:
        ap.error("--layers must be >= 1")
    return args


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_environment(device: str) -> None:
    """What OpenRLHF's Ray actor sets for a rank (world size 1), and DeepSpeed's CPU accelerator on CPU."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="1", RANK="0")
    os.environ["LOCAL_RANK"] = "0"
    if device == "cpu":
        os.environ["DS_ACCELERATOR"] = "cpu"


def save_random_model(size: str, layers: int | None, dtype, device: str, out: str) -> dict:
    """A random Qwen3 of ``gpu_actor.SIZES[size]``'s dimensions and the tiny tokenizer, saved to ``out``."""
    import torch
    from gpu_actor import SIZES
    from transformers import AutoModelForCausalLM, Qwen3Config

    from openrlhf_dppo.tiny.tokenizer import build_tokenizer

    dims = dict(SIZES[size][0], **({"num_hidden_layers": layers} if layers else {}))
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(Qwen3Config(**dims), dtype=dtype)
    model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    dims["params"] = sum(p.numel() for p in model.parameters())
    del model
    return dims


def cli_args(model: str, shape: dict, param_dtype: str, seed: int):
    """OpenRLHF's namespace through our CLI's parse and validation (the DPPO arm's flags)."""
    from openrlhf_dppo.cli import train_dppo_ray

    B, G = shape["prompts"], shape["group"]
    argv = [
        "--actor.model_name_or_path", model, "--reward.remote_url", "reward.py",
        "--actor.num_nodes", "1", "--actor.num_gpus_per_node", "1", "--vllm.num_engines", "1",
        "--ds.zero_stage", "3", "--ds.param_dtype", param_dtype, "--train.seed", str(seed),
        "--rollout.batch_size", str(B), "--rollout.n_samples_per_prompt", str(G),
        "--train.batch_size", str(B * G // 2), "--train.micro_batch_size", "1", "--train.dynamic_batch_enable",
        "--train.max_tokens_per_gpu", str(shape["max_tokens"]), "--rollout.max_tokens_per_gpu",
        str(shape["max_tokens"]), "--data.max_len", str(shape["prompt"][1] + shape["response"][1]),
        "--rollout.max_new_tokens", str(shape["response"][1]), "--algo.advantage.estimator", "group_norm",
        "--algo.kl.use_loss", "--algo.kl.init_coef", str(KL_COEF), "--algo.kl.estimator", "k3",
        "--actor.gradient_checkpointing_enable",
        "--actor.adam.lr", "1e-5", "--actor.lr_scheduler", "constant", "--actor.lr_warmup_ratio", "0",
        "--dppo.completion_prune_rate", str(1 - KEEP_PROB),
    ]  # fmt: skip
    out = {}
    train_dppo_ray.main(argv, train_fn=lambda a: out.setdefault("args", a))
    return out["args"]


def synthetic_items(shape: dict, vocab: int, seed: int) -> list:
    """B x G single-sample Experiences (as ``split_experience_batch`` makes them): random tokens,
    prompt and response lengths uniform in the shape's ranges (one prompt per group), a reward each."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import Experience

    gen = torch.Generator().manual_seed(seed)

    def uniform(lo_hi) -> int:
        return int(torch.randint(lo_hi[0], lo_hi[1] + 1, (), generator=gen))

    items = []
    for _ in range(shape["prompts"]):
        prompt = torch.randint(3, vocab, (uniform(shape["prompt"]),), generator=gen)
        for _ in range(shape["group"]):
            n = uniform(shape["response"])
            seq = torch.cat([prompt, torch.randint(3, vocab, (n,), generator=gen)])
            action = torch.zeros(len(seq) - 1, dtype=torch.bool)
            action[len(prompt) - 1 :] = True  # position t predicts token t + 1
            items.append(
                Experience(
                    sequences=seq,
                    attention_mask=torch.ones(len(seq), dtype=torch.long),
                    action_mask=action,
                    response_length=torch.tensor(float(n)),
                    total_length=torch.tensor(float(len(seq))),
                    info={"reward": torch.rand((), generator=gen)},
                )  # fmt: skip
            )
    return items


def score(actor, items: list, group: int, max_tokens: int):
    """The batch with what the experience maker adds: old log-probs from the actor's forward (in
    forward batches of at most ``max_tokens`` tokens, as ``--rollout.max_tokens_per_gpu`` bounds
    them), a reference shifted per token, group-normalised advantages (OpenRLHF's group_norm) as
    returns and advantages."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import make_experience_batch, split_experience_batch

    chunks, tokens = [[]], 0
    for it in items:
        n = int(it.total_length)
        if chunks[-1] and tokens + n > max_tokens:
            chunks.append([])
            tokens = 0
        chunks[-1].append(it)
        tokens += n
    scored = []
    for chunk in chunks:
        part = make_experience_batch(chunk)
        logp = actor.forward(part.sequences, part.action_mask, part.attention_mask).float()
        feature = (part.sequences[:, 1:] % 3).float() - 1.0
        part.action_log_probs = logp * part.action_mask
        part.base_action_log_probs = (logp - 0.05 * feature) * part.action_mask
        scored.extend(split_experience_batch(part))
    batch = make_experience_batch(scored)
    rewards = torch.stack(batch.info["reward"]).float().reshape(-1, group)
    adv = ((rewards - rewards.mean(-1, keepdim=True)) / (rewards.std(-1, keepdim=True) + 1e-9)).reshape(-1)
    batch.returns = adv[:, None] * batch.action_mask
    batch.advantages = batch.returns.clone()
    return batch


def dppo_batch(batch, args, seed: int):
    """A seeded half of the sequences, weight 1 / KEEP_PROB folded into their advantages, planned by
    ``build_dispatch`` with the full batch's normalisers -> (the rank's Experience, the plan)."""
    import torch
    from openrlhf.trainer.ppo_utils.experience import split_experience_batch

    from openrlhf_dppo.adapters.dispatch import SAMPLE_WEIGHT, build_dispatch
    from openrlhf_dppo.core import fold_weights

    items = split_experience_batch(batch)
    z_tok = float(sum(int(it.action_mask.sum()) for it in items))  # every sequence was drawn (q = 1)
    z_seq = float(len(items))
    order = torch.randperm(len(items), generator=torch.Generator().manual_seed(seed + 1))
    kept = [items[i] for i in sorted(order[: round(KEEP_PROB * len(items))].tolist())]
    for it in kept:
        it.advantages = fold_weights(it.returns[None], torch.tensor([1 / KEEP_PROB]))[0]
        it.info[SAMPLE_WEIGHT] = torch.tensor(1 / KEEP_PROB)
    steps = max(1, args.rollout.batch_size * args.rollout.n_samples_per_prompt // args.train.batch_size)
    plan = build_dispatch(kept, 1, args.train.max_tokens_per_gpu, steps, z_tok, z_seq)
    return plan.rank_experiences()[0], plan, kept


def torch_adam(strategy) -> None:
    """DeepSpeed's AdamW as ``torch.optim.AdamW`` (``torch_adam``): no FusedAdam kernel to compile."""
    original = strategy.get_ds_train_config

    def config(*a, **kw):
        cfg = original(*a, **kw)
        if "optimizer" in cfg:
            cfg["optimizer"].setdefault("params", {})["torch_adam"] = True
        return cfg

    strategy.get_ds_train_config = config


def finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def run_arm(actor, name: str, batch, expected: dict, device: str) -> dict:
    """Append ``batch``, ``fit`` once; counts, steps and devices against ``expected``."""
    from openrlhf_dppo import metric_keys as K

    trainer = actor.trainer
    seen = []  # per micro-batch: (rows, device type) as training_step receives it
    step_fn = trainer.training_step

    def counted(experience, *a, **kw):
        seen.append((int(experience.action_mask.shape[0]), experience.sequences.device.type))
        return step_fn(experience, *a, **kw)

    engine = actor.actor.model
    steps_before = engine.global_steps
    trainer.training_step = counted
    t0 = time.perf_counter()
    try:
        actor.append(batch)
        status = actor.fit(kl_ctl=KL_COEF)
    finally:
        del trainer.training_step  # the instance attribute only shadowed the method
    fit_s = time.perf_counter() - t0
    steps = engine.global_steps - steps_before
    status = {k: float(v) for k, v in status.items() if isinstance(v, (int, float))}
    checks = {
        "losses_finite": all(finite(status.get(k)) for k in ("policy_loss", "kl")),
        "grad_norm_finite_positive": finite(status.get("actor_grad_norm")) and status["actor_grad_norm"] > 0,
        "samples_trained": status.get(K.SAMPLES_TRAINED) == expected["samples"],
        "tokens_trained": status.get(K.TOKENS_TRAINED) == expected["tokens"],
        "fillers": status.get(K.SAMPLES_FILLERS) == expected["fillers"],
        "optimizer_steps": steps == expected["steps"],
        "micro_batches_on_device": bool(seen) and all(dev == device for _, dev in seen),
        "micro_batches": len(seen) == expected["micro_batches"] if expected["micro_batches"] else bool(seen),
        "rows_once": sum(r for r, _ in seen) == expected["samples"] + expected["fillers"],  # one epoch
    }
    return dict(
        arm=name, expected=expected, status=status, optimizer_steps=steps, micro_batches=len(seen),
        rows=sum(r for r, _ in seen), devices=sorted({d for _, d in seen}), fit_s=fit_s, checks=checks,
        ok=all(checks.values()),
    )  # fmt: skip


class Phases:
    """Times each phase, prints it as it ends (the smoke's log shows how far a run got) and remembers
    the phase that raised, for the JSON."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self.current: str | None = None

    @contextlib.contextmanager
    def __call__(self, name: str):
        self.current, t0 = name, time.perf_counter()
        yield
        self.timings[f"{name}_s"] = time.perf_counter() - t0
        print(f"gpu_smoke_actor: {name} done in {self.timings[f'{name}_s']:.1f} s", flush=True)
        self.current = None


def build_actor(opts, phase: Phases, workdir: str) -> tuple:
    """Imports (the CPU layer first on CPU), the random model, the CLI's args, the policy actor ->
    (actor, args, dims, env)."""
    with phase("imports"):
        from openrlhf_dppo._host import prepare_host

        prepare_host()
        if opts.device == "cpu":
            from openrlhf_dppo.compat import cpu

            cpu.install(cpu.RAY_WORKER)  # what every Ray worker of the CPU pipeline gets
            # DeepSpeed's shared-memory CPU all-reduce is a C++ op compiled at first use (minutes on 2
            # cores); one rank never all-reduces through it, and DeepSpeed runs without it when absent.
            # (``import deepspeed.comm.torch as m`` would bind torch itself: deepspeed.comm re-exports it.)
            importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
        import deepspeed
        import torch
        import transformers
        from openrlhf.utils import get_strategy

        from openrlhf_dppo._host import installed_openrlhf_version
        from openrlhf_dppo.adapters.actor import DPPOActorTrainer, DPPOPolicyModelActor
        from openrlhf_dppo.adapters.step import unwrap_actor_class
        from openrlhf_dppo.compat.flash_attn_stub import real_flash_attn_available
    cuda = opts.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda, but torch sees no CUDA device")
    param_dtype = "bf16" if cuda else "fp32"
    with phase("model_build"):
        dtype = torch.bfloat16 if cuda else torch.float32
        dims = save_random_model(opts.size, opts.layers, dtype, opts.device, workdir)
    args = cli_args(workdir, SHAPES[opts.size], param_dtype, opts.seed)
    if not real_flash_attn_available():
        args.ds.attn_implementation = "sdpa"  # packing asked for flash_attention_2 (docstring)
    args.vllm.sync_backend = "gloo"  # no engine (docstring)
    env = dict(
        device=torch.cuda.get_device_name(0) if cuda else "cpu", torch=torch.__version__,
        transformers=transformers.__version__, deepspeed=deepspeed.__version__,
        openrlhf=installed_openrlhf_version(), attn=args.ds.attn_implementation, param_dtype=param_dtype,
        optimizer=opts.optimizer, fused_adam_build_s=None,
    )  # fmt: skip
    if opts.optimizer == "fused":
        from deepspeed.accelerator import get_accelerator

        with phase("fused_adam_build"):
            get_accelerator().create_op_builder("FusedAdamBuilder").load()
        env["fused_adam_build_s"] = phase.timings["fused_adam_build_s"]
    strategy = get_strategy(args)
    if opts.optimizer == "torch":
        torch_adam(strategy)
    with phase("init"):
        actor = object.__new__(
            unwrap_actor_class(DPPOPolicyModelActor)
        )  # the Ray actor's __init__ sets env only
        actor.init_model_from_pretrained(strategy, workdir, max_steps=4, vllm_engines=None)
    if not isinstance(actor.trainer, DPPOActorTrainer):
        raise RuntimeError(
            f"expected the policy actor to build a DPPOActorTrainer, got {type(actor.trainer)}"
        )
    return actor, args, dims, env


def train_arms(opts, phase: Phases, actor, args, dims) -> dict:
    shape = SHAPES[opts.size]
    with phase("score"):
        items = synthetic_items(shape, dims["vocab_size"], opts.seed)
        batch = score(actor, items, shape["group"], shape["max_tokens"])
    arms = {}
    for name in opts.arms:
        if name == "grpo":
            n = float(len(items))
            steps = int(n // args.train.batch_size)
            expected = dict(
                samples=n, tokens=float(batch.action_mask.sum()), fillers=0.0, steps=steps, micro_batches=None
            )
            fed = batch
        else:
            fed, plan, kept = dppo_batch(batch, args, opts.seed)
            expected = dict(
                samples=float(len(kept)), tokens=float(sum(int(it.action_mask.sum()) for it in kept)),
                fillers=float(plan.fillers), steps=plan.num_steps, micro_batches=plan.micro_batches_per_rank,
            )  # fmt: skip
        with phase(f"arm_{name}"):
            arms[name] = run_arm(actor, name, fed, expected, opts.device)
        print(f"gpu_smoke_actor: {name}: {'ok' if arms[name]['ok'] else 'FAILED'} {arms[name]['checks']}")
    return arms


def main(argv=None) -> dict:
    """Runs the smoke; the JSON is written also when a phase raises (``error``, ``failed_phase``)."""
    opts = parse_args(argv)
    set_environment(opts.device)
    phase = Phases()
    result = dict(config=vars(opts), shape=SHAPES[opts.size], ok=False, error=None, failed_phase=None)
    try:
        with tempfile.TemporaryDirectory(dir=opts.workdir) as tmp:
            actor, args, dims, env = build_actor(opts, phase, tmp)
        result.update(model=dims, env=env)
        result["arms"] = train_arms(opts, phase, actor, args, dims)
        result["ok"] = bool(result["arms"]) and all(a["ok"] for a in result["arms"].values())
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {err}"
        result["failed_phase"] = phase.current or "setup"
        raise
    finally:
        import torch

        if opts.device == "cuda" and torch.cuda.is_available():
            result.setdefault("env", {})["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        result["timings"] = phase.timings
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(result, f, indent=1, default=str)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
