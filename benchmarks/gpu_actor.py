"""Actor forward + backward: full padded GRPO micro-batches vs pruned, window-packed micro-batches.

What is timed: one training pass of the actor over a whole batch (every micro-batch: forward, per-token
log-probs of the response tokens, a policy-gradient loss, backward; gradients accumulate, no optimizer
step) on a Qwen3-shaped causal LM with random weights (``--size qwen3-0.6b``: Qwen3-0.6B's dimensions;
``--size tiny`` for CPU). Arms, on the same model and the same sequences:
1. ``grpo padded``: all B x G sequences in arrival order (prompt groups together), ``--micro-batch``
   sequences per micro-batch, right-padded to the longest of the micro-batch (2-D attention mask).
2. ``packed f``: a uniform random subset of round(f * B * G) sequences (so the kept lengths follow
   the full distribution; DPPO keeps by |advantage|, the same as uniform only where |A| does not
   depend on length, e.g. not where truncated responses are mostly wrong), packed by ``openrlhf_dppo.core.pack`` (the window packer) under ``--capacity`` tokens per
   micro-batch. A packed micro-batch is ONE row: the sequences concatenated, ``position_ids``
   restarting at 0 for each, ``attention_mask=None``, ``use_cache=False``. f = 1.0 is packing alone.
Lengths (per GPU share of a step): prompts U[prompt_min, prompt_max] shared by the G completions of a
prompt; responses log-normal (median ``--response-median`` x max, sigma ``--sigma``) capped at
``--max-response``, plus a fraction ``--cap-frac`` that ran to the cap (chain-of-thought that never
stopped). Default capacity = micro-batch x (prompt_max + max_response): the padded arm's worst case,
so both arms get the same token budget per micro-batch.

Attention: ``flash_attention_2`` (flash-attn varlen: each sequence of a packed row attends only to
itself, cost sum of L_i^2) when a real ``flash_attn`` is importable on CUDA, else ``sdpa``. transformers
5.15 with sdpa: when ``attention_mask`` is None and there is no cache, ``masking_utils.
find_packed_sequence_indices`` derives the sequence ids from the restarting ``position_ids`` and
``create_causal_mask`` ANDs a same-sequence mask into the causal one, so sdpa DOES isolate the sequences
(``check`` below measures it), but as a dense (L x L) boolean mask over the whole row: its attention
cost is that of the row length L, not of each sequence, so a packed sdpa time overstates the attention
cost of a varlen kernel. The padded arm also runs masked sdpa (flash-attn's unpadded path under
``flash_attention_2``).

Check (before timing): the per-token response log-probs and the loss of a few sequences in the padded
form and in one packed row must agree; a control row with continuous position ids (no restart, so the
sequences see each other) must not: ``packed_ok`` = packed difference < 0.1 x control difference.
Printed (a warning when not ok) and in the JSON under ``check``.

Usage: python benchmarks/gpu_actor.py --size qwen3-0.6b --device cuda --json out.json
       python benchmarks/gpu_actor.py --size tiny --device cpu
Needs only torch, transformers and ``openrlhf_dppo.core`` (torch + numpy).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from openrlhf_dppo.core import pack  # noqa: E402
from openrlhf_dppo.core.packing import WINDOW  # noqa: E402
from openrlhf_dppo.metric_keys import PACK_DENSITY, PACK_LOWER_BOUND  # noqa: E402

# Qwen3-0.6B's config.json dimensions (random weights here)
QWEN3_06B = dict(
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
    num_key_value_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)  # fmt: skip
TINY = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True,
)  # fmt: skip
# model dims, then batch defaults
SIZES = {
    "qwen3-0.6b": (QWEN3_06B, dict(prompts=16, group=8, prompt_min=100, prompt_max=300, max_response=4096)),
    "tiny": (TINY, dict(prompts=8, group=8, prompt_min=8, prompt_max=24, max_response=128)),
}


def cot_lengths(n_prompts, group, prompt_min, prompt_max, max_response, median_frac, sigma, cap_frac, rng):
    """-> (prompt_lens, total_lens), each (n_prompts * group,) int64; response = total - prompt >= 1."""
    n = n_prompts * group
    prompt = np.repeat(rng.integers(prompt_min, prompt_max + 1, n_prompts), group)
    resp = rng.lognormal(np.log(median_frac * max_response), sigma, n).astype(np.int64) + 1
    resp = np.where(rng.random(n) < cap_frac, max_response, np.minimum(resp, max_response))
    return prompt.astype(np.int64), (prompt + resp).astype(np.int64)


def prune_uniform(n: int, frac: float, seed: int) -> np.ndarray:
    """Sorted indices of a uniform random subset of round(frac * n) (at least 1) of n sequences: the first
    k of one seeded permutation, so the subsets of smaller fractions are nested in those of larger ones."""
    k = max(1, int(round(frac * n)))
    return np.sort(np.random.default_rng([seed, 7]).permutation(n)[:k])


@dataclass
class MicroBatch:
    """input_ids/position_ids/targets/weights: (rows, L); attention_mask (rows, L) or None (packed).
    ``weights[r, t]`` is the loss weight of predicting ``targets[r, t]`` from position t (0 elsewhere);
    ``spans`` = (sequence id, row, offset of its first token)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    targets: torch.Tensor
    weights: torch.Tensor
    spans: list[tuple[int, int, int]]
    tokens: int


def build(ids, seqs, prompt_lens, seq_weight, packed, device, restart=True) -> MicroBatch:
    """Sequences ``ids`` -> one padded micro-batch (one row each) or one packed row. seqs[i]: (L_i,) long
    token ids; seq_weight[i]: loss weight per response token of sequence i (advantage * IS weight /
    (response length * batch size)). ``restart=False`` gives the packed control with no position reset."""
    lens = [len(seqs[i]) for i in ids]
    rows, width = (1, sum(lens)) if packed else (len(ids), max(lens))
    inp = torch.zeros(rows, width, dtype=torch.long)
    pos = torch.arange(width).repeat(rows, 1)
    mask = torch.zeros(rows, width, dtype=torch.long)
    tgt = torch.zeros(rows, width, dtype=torch.long)
    wts = torch.zeros(rows, width, dtype=torch.float32)
    spans, off = [], 0
    for k, (i, n) in enumerate(zip(ids, lens)):
        row, start = (0, off) if packed else (k, 0)
        inp[row, start : start + n] = seqs[i]
        if restart:
            pos[row, start : start + n] = torch.arange(n)
        mask[row, start : start + n] = 1
        p = int(prompt_lens[i])  # positions p-1 .. n-2 predict the response tokens p .. n-1
        tgt[row, start + p - 1 : start + n - 1] = seqs[i][p:]
        wts[row, start + p - 1 : start + n - 1] = float(seq_weight[i])
        spans.append((int(i), row, start))
        off += n
    mask = None if packed else mask.to(device)
    return MicroBatch(inp.to(device), pos.to(device), mask, tgt.to(device), wts.to(device), spans, sum(lens))


def forward_loss(model, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (loss = -sum weights * log p(targets), per-position log-probs (rows, L) in fp32)."""
    # use_cache=False: with a cache, transformers does not derive the packed-sequence mask from position_ids
    kw = dict(attention_mask=mb.attention_mask, position_ids=mb.position_ids, use_cache=False)
    logits = model(mb.input_ids, **kw).logits.float()
    logp = -F.cross_entropy(logits.flatten(0, 1), mb.targets.flatten(), reduction="none")
    logp = logp.view_as(mb.targets)
    return -(logp * mb.weights).sum(), logp


def response_logps(mb: MicroBatch, logp, prompt_lens, seqs) -> dict[int, torch.Tensor]:
    """Sequence id -> (response length,) log-probs of its response tokens, from (rows, L) ``logp``."""
    return {i: logp[r, s + int(prompt_lens[i]) - 1 : s + len(seqs[i]) - 1] for i, r, s in mb.spans}


@torch.no_grad()
def check_packed_equals_padded(model, seqs, prompt_lens, seq_weight, ids, device) -> dict:
    """Same sequences, padded vs one packed row vs the no-restart control -> max |delta log p|, loss rel diff."""
    res = {}
    for name, packed, restart in (("padded", False, True), ("packed", True, True), ("control", True, False)):
        mb = build(ids, seqs, prompt_lens, seq_weight, packed, device, restart)
        loss, logp = forward_loss(model, mb)
        res[name] = (float(loss), response_logps(mb, logp, prompt_lens, seqs))

    def diff(a):
        return max(float((res[a][1][i] - res["padded"][1][i]).abs().max()) for i in ids)

    return {
        "sequences": [int(i) for i in ids],
        "tokens": mb.tokens,
        "packed_max_abs_logp_diff": diff("packed"),
        "packed_loss_rel_diff": abs(res["packed"][0] - res["padded"][0]) / max(abs(res["padded"][0]), 1e-30),
        "control_max_abs_logp_diff": diff("control"),
        "packed_ok": diff("packed") < 0.1 * diff("control"),
        "padded_loss": res["padded"][0],
        "packed_loss": res["packed"][0],
    }


def pick_attention(requested: str, device: str) -> str:
    """``auto``: flash_attention_2 on CUDA with a real flash-attn (the repo's CPU stand-in has no
    ``flash_attn_varlen_func``), else sdpa. An explicit choice is checked, not second-guessed."""
    try:
        real = hasattr(importlib.import_module("flash_attn"), "flash_attn_varlen_func") and "cuda" in device
    except ImportError:
        real = False
    if requested == "flash_attention_2" and not real:
        raise SystemExit("--attn flash_attention_2 needs a CUDA --device and an installed flash-attn")
    return ("flash_attention_2" if real else "sdpa") if requested == "auto" else requested


def make_model(dims: dict, attn: str, dtype, device, grad_ckpt: bool):
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(**dims, use_cache=False)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.train()
    if grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def time_pass(model, mbs, device) -> float:
    """Seconds for forward + backward over every micro-batch (gradients zeroed outside the timed part);
    CUDA events between two synchronisations on GPU, perf_counter on CPU."""
    model.zero_grad(set_to_none=True)
    if not device.startswith("cuda"):
        t0 = time.perf_counter()
        for mb in mbs:
            forward_loss(model, mb)[0].backward()
        return time.perf_counter() - t0
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for mb in mbs:
        forward_loss(model, mb)[0].backward()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def make_arms(args, seqs, prompt_lens, lens, adv, device) -> list[dict]:
    """The padded GRPO arm, then one pruned + packed arm per kept fraction. ``density``: padded = real /
    padded tokens; packed = the packer's real / (micro-batches x capacity) (rows are not padded)."""
    n = len(lens)
    total = int(lens.sum())
    arms = []
    weight = adv / ((lens - prompt_lens) * n)  # full-batch normaliser n = B * G (docs/METHOD.md condition 1)
    groups = [list(range(s, min(s + args.micro_batch, n))) for s in range(0, n, args.micro_batch)]
    mbs = [build(g, seqs, prompt_lens, weight, False, device) for g in groups]
    slots = sum(mb.input_ids.numel() for mb in mbs)
    arms.append(dict(arm="grpo padded", frac=1.0, seqs=n, tokens=total, mbs=mbs, density=total / slots))
    arms[0]["lower"] = None
    for frac in args.fractions:
        kept = prune_uniform(n, frac, args.seed)
        w = weight * n / len(kept)  # inverse keep probability (len(kept) / n) folded into the weight
        plan, m = pack(lens[kept], args.capacity, dp_size=1)
        bins = [[int(kept[j]) for j in b] for b in plan.rank_micro_batches[0]]
        mbs = [build(b, seqs, prompt_lens, w, True, device) for b in bins]
        tokens = int(lens[kept].sum())
        assert tokens == sum(mb.tokens for mb in mbs), "the packer lost or repeated a sequence"
        row = dict(arm=f"packed {frac:g}", frac=frac, seqs=len(kept), tokens=tokens, mbs=mbs)
        row.update(density=m[PACK_DENSITY], lower=int(m[PACK_LOWER_BOUND]))
        arms.append(row)
    for a in arms:
        a["kept_token_ratio"] = a["tokens"] / total
        a["micro_batches"] = len(a["mbs"])
    return arms


def fmt_table(rows) -> str:
    head = (
        "| arm | kept frac | sequences | tokens | kept-token ratio (ideal) | micro-batches (lower bound) | "
        "density | fwd+bwd s, median (min-max) | time ratio vs GRPO | time ratio / kept-token ratio | peak GiB |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        lb = "" if r["lower_bound"] is None else f" ({r['lower_bound']})"
        mem = "" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        lines.append(
            f"| {r['arm']} | {r['frac']:g} | {r['sequences']} | {r['tokens']} | {r['kept_token_ratio']:.3f} | "
            f"{r['micro_batches']}{lb} | {r['density']:.3f} | {r['median_s']:.4f} ({r['min_s']:.4f}-"
            f"{r['max_s']:.4f}) | {r['time_ratio']:.3f} | {r['time_ratio'] / r['kept_token_ratio']:.3f} | {mem} |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="qwen3-0.6b", help="dims and batch defaults")
    ap.add_argument("--layers", type=int, help="override the size's layer count (e.g. 2 for a CPU check)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], help="default: bf16 (cuda), fp32 (cpu)")
    ap.add_argument("--attn", choices=["auto", "flash_attention_2", "sdpa", "eager"], default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", type=int, help="B, prompts in the (per-GPU) batch")
    ap.add_argument("--group", type=int, help="G, completions per prompt")
    ap.add_argument("--prompt-min", type=int)
    ap.add_argument("--prompt-max", type=int)
    ap.add_argument("--max-response", type=int, help="generation cap (tokens)")
    ap.add_argument("--response-median", type=float, default=0.12, help="median response / max-response")
    ap.add_argument("--sigma", type=float, default=0.8, help="log-normal sigma of the response lengths")
    ap.add_argument("--cap-frac", type=float, default=0.05, help="fraction of responses that run to the cap")
    ap.add_argument("--micro-batch", type=int, default=4, help="sequences per padded GRPO micro-batch")
    ap.add_argument("--capacity", type=int, help="tokens per packed micro-batch (default: see above)")
    ap.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.7, 0.5, 0.3], help="kept fractions")
    ap.add_argument("--warmup", type=int, default=2, help="untimed passes per arm")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per arm (interleaved over arms)")
    ap.add_argument("--check-seqs", type=int, default=4, help="sequences in the packed check (0: skip)")
    ap.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing (as on a real actor)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--json", help="write config, check and rows to this file")
    args = ap.parse_args(argv)
    for key, val in SIZES[args.size][1].items():
        if getattr(args, key) is None:
            setattr(args, key, val)
    if args.capacity is None:
        args.capacity = args.micro_batch * (args.prompt_max + args.max_response)
    if not all(0.0 < f <= 1.0 for f in args.fractions):
        ap.error(f"--fractions must be in (0, 1], got {args.fractions}")
    if not 1 <= args.prompt_min <= args.prompt_max or args.max_response < 1:
        ap.error("need 1 <= --prompt-min <= --prompt-max and --max-response >= 1")
    if args.capacity < args.prompt_max + args.max_response:
        ap.error(f"--capacity {args.capacity} < --prompt-max + --max-response, the longest possible sequence")
    if args.repeats < 1 or args.micro_batch < 1 or (args.layers is not None and args.layers < 1):
        ap.error("--repeats, --micro-batch and --layers must be >= 1")
    return args


def measure(model, arms, args) -> list[dict]:
    """Warm-up passes per arm, then ``repeats`` rounds over the arms (interleaved, so a slow drift of the
    machine hits every arm alike) -> one row per arm; peak memory per arm on CUDA."""
    cuda = args.device.startswith("cuda")
    times, peak = {a["arm"]: [] for a in arms}, {a["arm"]: 0 for a in arms}
    for a in arms:
        for _ in range(args.warmup):
            time_pass(model, a["mbs"], args.device)
    for _ in range(args.repeats):
        for a in arms:
            if cuda:
                torch.cuda.reset_peak_memory_stats(args.device)
            times[a["arm"]].append(time_pass(model, a["mbs"], args.device))
            if cuda:
                peak[a["arm"]] = max(peak[a["arm"]], torch.cuda.max_memory_allocated(args.device))
    base = statistics.median(times[arms[0]["arm"]])
    rows = []
    for a in arms:
        t = times[a["arm"]]
        row = {k: a[k] for k in ("arm", "frac", "tokens", "kept_token_ratio", "micro_batches", "density")}
        row.update(sequences=a["seqs"], lower_bound=a["lower"], median_s=statistics.median(t), min_s=min(t))
        row.update(max_s=max(t), times_s=t, time_ratio=statistics.median(t) / base)
        row["peak_gib"] = peak[a["arm"]] / 2**30 if cuda else None
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, cuda = args.device, args.device.startswith("cuda")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype or ("bf16" if cuda else "fp32")]
    attn = pick_attention(args.attn, device)
    dims = dict(SIZES[args.size][0], **({"num_hidden_layers": args.layers} if args.layers else {}))
    rng = np.random.default_rng(args.seed)
    prompt_lens, lens = cot_lengths(
        args.prompts, args.group, args.prompt_min, args.prompt_max, args.max_response,
        args.response_median, args.sigma, args.cap_frac, rng,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(args.seed)
    seqs = [torch.randint(0, dims["vocab_size"], (int(n),), generator=gen) for n in lens]
    adv = np.where(rng.random(len(lens)) < 0.5, -1.0, 1.0)
    torch.manual_seed(args.seed)
    model = make_model(dims, attn, dtype, device, args.grad_ckpt)

    check = None
    if args.check_seqs:  # a few random sequences that fit one packed row
        ids, room = [], args.capacity
        for i in np.random.default_rng(args.seed + 1).permutation(len(lens)).tolist():
            if len(ids) < args.check_seqs and lens[i] <= room:
                ids.append(i)
                room -= int(lens[i])
        weight = adv / ((lens - prompt_lens) * len(lens))
        check = check_packed_equals_padded(model, seqs, prompt_lens, weight, sorted(ids), device)
    rows = measure(model, make_arms(args, seqs, prompt_lens, lens, adv, device), args)

    import transformers

    resp = lens - prompt_lens
    env = dict(
        device=torch.cuda.get_device_name(device) if cuda else "cpu", attn=attn, dtype=str(dtype),
        params=sum(p.numel() for p in model.parameters()), torch=torch.__version__,
        transformers=transformers.__version__, loadavg=os.getloadavg(), threads=torch.get_num_threads(),
    )  # fmt: skip
    lengths = dict(
        total_tokens=int(lens.sum()), response_median=float(np.median(resp)), response_mean=float(resp.mean()),
        response_p95=float(np.percentile(resp, 95)), at_cap=int((resp == args.max_response).sum()),
    )  # fmt: skip
    print(f"gpu_actor: {args.size}, {env['params'] / 1e6:.2f}M params, {dtype}, {attn}, on {env['device']}")
    print(
        f"batch {args.prompts} x {args.group} = {len(lens)} sequences, {lengths['total_tokens']} tokens; response "
        f"median {lengths['response_median']:.0f}, mean {lengths['response_mean']:.0f}, p95 "
        f"{lengths['response_p95']:.0f}, {lengths['at_cap']} at the cap {args.max_response}; padded micro-batch "
        f"{args.micro_batch} sequences, packed capacity {args.capacity} tokens, window {WINDOW}"
    )
    la = ", ".join(f"{x:.2f}" for x in env["loadavg"])
    print(f"warm-up {args.warmup}, repeats {args.repeats}, {env['threads']} torch threads; load average {la}")
    if check:
        print(
            f"check ({len(check['sequences'])} sequences, {check['tokens']} tokens): packed vs padded max |dlogp| "
            f"{check['packed_max_abs_logp_diff']:.3g}, loss rel diff {check['packed_loss_rel_diff']:.3g}; "
            f"control (no position restart) max |dlogp| {check['control_max_abs_logp_diff']:.3g}"
            + ("" if check["packed_ok"] else "\nWARNING: packed != padded: packed timings invalid")
        )
    print(fmt_table(rows))
    result = dict(config=vars(args), env=env, lengths=lengths, check=check, rows=rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
