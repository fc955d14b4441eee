"""Whole-step benchmark of the CPU pipeline: GRPO vs DPPO through the real CLI, side by side.

    python benchmarks/pipeline_step.py build                       # the benchmark model (cached)
    python benchmarks/pipeline_step.py run --name grpo_a --rates none
    python benchmarks/pipeline_step.py run --name dppo_55 --rates 0.5 0.5
    python benchmarks/pipeline_step.py table --grpo runs/pipeline/grpo_a ... --dppo runs/pipeline/dppo_55 ...

``build`` writes a random-weight Qwen3 of the tiny builder's ``--size`` (``openrlhf_dppo.tiny.build.model_config``:
a size name or ``HIDDENxLAYERSxINTER``; default ``m`` = 256x4x1024, 3.94M parameters with the untied head
used here; the tiny task's character tokenizer) whose output head gives ``<eos>``, ``<pad>`` and ``<bos>``
a zero row and every other token a row of norm ``--head_scale``: the stop probability per token is
small, so completions are long and long-tailed (geometric, capped at ``--max_new``). Prompts: the first
``--data`` prompts of the tiny task's train.jsonl (built if missing). Reward:
``benchmarks/pipeline_reward.py`` (odd number of '7' characters: mixed groups).

``run`` launches ``python -m openrlhf_dppo.cli.train_dppo_ray`` with one fixed set of flags (the CPU
flags of examples/scripts/train_tiny_cpu.sh, packed micro-batches under one token budget for both
GRPO and DPPO) and only the DPPO flags differing. ``table`` reads the run directories with the compare
report's own functions (openrlhf_dppo.report) and prints the markdown tables of benchmarks/RESULTS.md:
each DPPO run is compared with the median of the GRPO runs' step times and generation shares.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL_DIR = ROOT / ".cache" / "pipeline_bench"
RUNS = ROOT / "runs" / "pipeline"


def build(args) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sys.path.insert(0, str(ROOT))
    from openrlhf_dppo.tiny import build as tiny_build
    from openrlhf_dppo.tiny.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_tokenizer

    out = Path(args.out)
    spec = dict(size=args.size, head_scale=args.head_scale, data=args.data, seed=args.seed)
    info_path = out / "bench_info.json"
    if info_path.exists() and json.loads(info_path.read_text()).get("spec") == spec:
        print(f"cached: {out}")
        return
    tiny_dir = ROOT / ".cache" / "tiny"
    tiny_build.ensure_built(str(tiny_dir), seed=0)  # the prompts
    torch.manual_seed(args.seed)
    config = Qwen3Config(
        **tiny_build.model_config(args.size, tie_word_embeddings=False, max_position_embeddings=512)
    )
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        w = model.lm_head.weight
        w.normal_(0.0, 1.0)
        w *= args.head_scale / w.norm(dim=1, keepdim=True)
        w[[EOS_ID, PAD_ID, BOS_ID]] = 0.0
    n_params = sum(p.numel() for p in model.parameters())
    model = model.to(torch.bfloat16)
    model.config.dtype = "bfloat16"
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(out / "model", safe_serialization=True)
    build_tokenizer().save_pretrained(out / "model")
    (out / "data").mkdir(parents=True, exist_ok=True)
    lines = (tiny_dir / "data" / "train.jsonl").read_text().splitlines()[: args.data]
    (out / "data" / "train.jsonl").write_text("\n".join(lines) + "\n")
    info_path.write_text(json.dumps({"spec": spec, "params": n_params}, indent=1))
    print(f"built {out}: {n_params / 1e6:.2f}M parameters, {len(lines)} prompts")


def run_command(args) -> list[str]:
    data = MODEL_DIR / "data" / "train.jsonl"
    n_data = sum(1 for _ in open(data))
    episodes = -(-args.steps * args.prompts // n_data)
    out = RUNS / args.name
    cmd = [
        str(ROOT / ".venv" / "bin" / "python"),
        "-m",
        "openrlhf_dppo.cli.train_dppo_ray",
        "--actor.model_name_or_path", str(MODEL_DIR / "model"),
        "--data.prompt_dataset", str(data), "--data.input_key", "input", "--data.label_key", "label",
        "--data.max_samples", str(n_data), "--train.num_episodes", str(episodes),
        "--reward.remote_url", str(ROOT / "benchmarks" / "pipeline_reward.py"),
        "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--vllm.num_engines", "1", "--vllm.tensor_parallel_size", "1", "--vllm.sync_backend", "gloo",
        "--vllm.enforce_eager",
        "--ds.attn_implementation", "sdpa", "--ds.param_dtype", "bf16", "--ds.zero_stage", "2",
        "--rollout.batch_size", str(args.prompts), "--rollout.n_samples_per_prompt", str(args.samples),
        "--rollout.micro_batch_size", "64",
        "--rollout.max_new_tokens", str(args.max_new), "--rollout.temperature", "1.0",
        "--data.max_len", str(args.max_new + 16),
        "--train.batch_size", str(args.prompts * args.samples), "--train.micro_batch_size", "64",
        "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", str(args.max_tokens),
        "--train.seed", "1",
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0", "--actor.lr_scheduler", "constant",
        "--ckpt.output_dir", str(out), "--ckpt.path", str(out / "ckpt"),
    ]  # fmt: skip
    if args.rates == ["none"]:
        cmd += ["--dppo.method", "grpo"]
    else:
        r_q, r_o = (float(x) for x in args.rates)
        cmd += [
            "--dppo.method",
            "dppo",
            "--dppo.prompt_rate_control",
            "fixed",
            "--dppo.prompt_prune_rate",
            str(r_q),
        ]
        cmd += ["--dppo.completion_prune_rate", str(r_o)]
    return cmd


def run(args) -> None:
    out = RUNS / args.name
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    cmd = run_command(args)
    load_before = os.getloadavg()
    t0 = time.time()
    with open(out / "train.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    note = {"rc": rc, "wall_s": round(time.time() - t0, 1), "load_before": load_before}
    note["load_after"] = os.getloadavg()
    (out / "bench_note.json").write_text(json.dumps(note))
    print(json.dumps({"name": args.name, **note}))
    if rc:
        subprocess.run(["tail", "-n", "30", str(out / "train.log")])
        sys.exit(rc)


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _spread(values):
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else (None, None)


def table(args) -> None:
    sys.path.insert(0, str(ROOT))
    from openrlhf_dppo import metric_keys as K
    from openrlhf_dppo.report import Settings, load_run
    from openrlhf_dppo.report import speedup as S
    from openrlhf_dppo.report.summary import summarize

    settings = Settings(warmup=args.warmup)
    grpo = [summarize(load_run(p), settings) for p in args.grpo]
    dppo = [summarize(load_run(p), settings) for p in args.dppo]
    phases = list(K.PHASES)

    def used(s):
        return S.after_warmup(s.run.train, args.warmup)

    def tok_per_s(s):
        return _med([r[K.TOKENS_TRAINED] / r[K.STEP_TOTAL] for r in used(s)])

    def step_spread(s):
        lo, hi = _spread([r[K.STEP_TOTAL] for r in used(s)])
        return f"{lo:.1f}-{hi:.1f}"

    def note(s):
        p = Path(s.run.path) / "bench_note.json"
        return json.loads(p.read_text()) if p.exists() else {}

    print("| run | steps used | " + " | ".join(p.split("/")[1] for p in phases) + " | step (min-max) | "
          "f | prompt keep | completion keep | tokens trained / s | load avg (start, end) |")  # fmt: skip
    print("|---" * (len(phases) + 8) + "|")
    for s in grpo + dppo:
        n = note(s)
        load = f"{n['load_before'][0]:.1f}, {n['load_after'][0]:.1f}" if n else ""
        cells = [f"{s.phases.get(p) or 0:.2f}" for p in phases]
        print(f"| {s.run.name} | {s.steps_used} | " + " | ".join(cells) + f" | {s.step_time:.2f} "
              f"({step_spread(s)}) | {s.generation_share:.2f} | {s.prompt_keep:.2f} | {s.completion_keep:.2f} "
              f"| {tok_per_s(s):.0f} | {load} |")  # fmt: skip

    t_grpo = _med([s.step_time for s in grpo])
    f = _med([s.generation_share for s in grpo])
    print()
    print(f"GRPO reference: median of the {len(grpo)} GRPO runs' median step time = {t_grpo:.2f} s, "
          f"generation share f = {f:.3f} (per run: "
          + ", ".join(f"{s.step_time:.2f} s / f {s.generation_share:.2f}" for s in grpo) + ")")  # fmt: skip
    print()
    print(
        "| DPPO run | configured (r_q, r_o) | measured (r_q, r_o) | step ratio T_dppo / T_grpo "
        "(range over GRPO runs) | ideal ratio | measured / ideal | speedup (ideal) | ratio of min steps "
        "| generation ratio | make_experience ratio | ppo_train ratio |"
    )
    print("|---" * 11 + "|")
    t_min = _med([min(r[K.STEP_TOTAL] for r in used(s)) for s in grpo])
    ph = {p: _med([s.phases[p] for s in grpo]) for p in phases}
    for s in dppo:
        r_q, r_o = 1 - s.prompt_keep, 1 - s.completion_keep
        ratio = s.step_time / t_grpo
        lo, hi = _spread([s.step_time / g.step_time for g in grpo])
        ideal = S.ideal_step_ratio(f, min(max(r_q, 0), 1), min(max(r_o, 0), 1))
        cq, co = s.configured_rates
        r_min = min(r[K.STEP_TOTAL] for r in used(s)) / t_min
        pr = " | ".join(f"{s.phases[p] / ph[p]:.2f}" for p in phases[:3])
        print(f"| {s.run.name} | ({cq}, {co}) | ({r_q:.2f}, {r_o:.2f}) | {ratio:.3f} ({lo:.3f}-{hi:.3f}) | "
              f"{ideal:.3f} | {ratio / ideal:.2f} | {1 / ratio:.2f}x ({1 / ideal:.2f}x) | {r_min:.3f} | {pr} |")  # fmt: skip

    pack = [k for k in (K.PACK_MICRO_BATCHES, K.PACK_LOWER_BOUND, K.PACK_DENSITY, K.PACK_RANK_IMBALANCE)
            if any(k in r for s in dppo for r in s.run.train)]  # fmt: skip
    if pack:
        print()
        print("| DPPO run | " + " | ".join(k.split("/")[1] for k in pack) + " | ppo_train median s |")
        print("|---|" + "---|" * (len(pack) + 1))
        for s in dppo:
            cells = [f"{_med([r.get(k) for r in used(s)]):.3f}" for k in pack]
            print(f"| {s.run.name} | " + " | ".join(cells) + f" | {s.phases[K.PPO_TRAIN]:.2f} |")
        if args.per_step:
            for s in dppo:
                print(f"\n{s.run.name} per step (micro-batches, lower bound, density):")
                for r in s.run.train:
                    print(f"  step {r['step']}: " + ", ".join(f"{r.get(k, float('nan')):.3f}" for k in pack))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--out", default=str(MODEL_DIR))
    b.add_argument(
        "--size", default="m", help="a size of openrlhf_dppo.tiny.build (name or HIDDENxLAYERSxINTER)"
    )
    b.add_argument("--head_scale", type=float, default=2.5)
    b.add_argument("--data", type=int, default=16)
    b.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("run")
    r.add_argument("--name", required=True)
    r.add_argument("--rates", nargs="+", required=True, help="'none' (GRPO) or R_Q R_O")
    r.add_argument("--steps", type=int, default=8)
    r.add_argument("--prompts", type=int, default=8)
    r.add_argument("--samples", type=int, default=8)
    r.add_argument("--max_new", type=int, default=128)
    r.add_argument("--max_tokens", type=int, default=2048)
    t = sub.add_parser("table")
    t.add_argument("--grpo", nargs="+", required=True)
    t.add_argument("--dppo", nargs="+", required=True)
    t.add_argument("--warmup", type=int, default=2)
    t.add_argument("--per_step", action="store_true")
    args = ap.parse_args(argv)
    {"build": build, "run": run, "table": table}[args.cmd](args)


if __name__ == "__main__":
    main()
