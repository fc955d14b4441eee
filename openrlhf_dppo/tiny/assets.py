"""What both tiny tasks' builds (``tiny/build.py``, ``tiny/countdown.py``) share: model sizes and their
Qwen3 config, the warm-start settings, the layout under ``--out`` and ``train_and_save``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time

from openrlhf_dppo.tiny import task
from openrlhf_dppo.tiny.arithmetic import arithmetic_used, weights_digest
from openrlhf_dppo.tiny.tokenizer import EOS_ID, PAD_ID, VOCAB
from openrlhf_dppo.tiny.warm import warm_start

SIZES = {
    "xs": (128, 2, 384),  # 0.40M parameters
    "s": (256, 2, 768),  # 1.58M: the embedded default
    "m": (256, 4, 1024),  # 3.9M with the untied head of benchmarks/pipeline_step.py
}
DEFAULT_SIZE = "s"
HEAD_DIM = 64
# the addition build's warm start (``tiny/build.py``'s docstring says why); countdown starts from it
WARM = dict(
    batch_size=64,
    lr=5e-3,
    steps=1825,
    dtype="float64",
    log_every=100,
    threads=1,
    arithmetic="avx2",
    state_bits=12,
)


def hash_sources(h, paths) -> None:
    """Update the hash ``h`` with the syntax tree of each Python file in ``paths``, without docstrings,
    comments or line numbers."""
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (
                isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
        h.update(ast.dump(tree).encode())


def parse_size(size: str) -> tuple[int, int, int]:
    """``(hidden, layers, intermediate)`` of a size name or a ``HxLxI`` string; ValueError otherwise."""
    if size in SIZES:
        return SIZES[size]
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", size)
    if not m:
        raise ValueError(f"--size {size!r}: expected one of {sorted(SIZES)} or HIDDENxLAYERSxINTERMEDIATE")
    hidden, layers, inter = (int(x) for x in m.groups())
    if hidden % HEAD_DIM or hidden < HEAD_DIM or layers < 1 or inter < 1:
        raise ValueError(
            f"--size {size!r}: hidden must be a positive multiple of {HEAD_DIM}, layers and inter >= 1"
        )
    return hidden, layers, inter


def model_config(size: str = DEFAULT_SIZE, **overrides) -> dict:
    """Keyword arguments of ``transformers.Qwen3Config`` for ``size`` on the task's tokenizer."""
    hidden, layers, inter = parse_size(size)
    heads = hidden // HEAD_DIM
    cfg = dict(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=HEAD_DIM,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=None,
    )
    cfg.update(overrides)
    return cfg


def paths(out: str) -> dict:
    p = {"model": os.path.join(out, "model"), "info": os.path.join(out, "build_info.json")}
    p.update({name: os.path.join(out, "data", f"{name}.jsonl") for name in task.SPLITS})
    return p


def train_and_save(
    out: str,
    seed: int,
    warm: dict,
    config_kwargs: dict,
    tok,
    splits: dict,
    supervised,
    measure,
    header: dict,
    log=print,
) -> dict:
    """Write ``splits`` (name -> rows) under ``out``, warm-start a fresh Qwen3 (``config_kwargs``, seeded)
    on ``supervised`` rows, cast it to bf16, read ``measure(model, tok) -> dict`` and save model and
    tokenizer. Returns the build info (``header`` first), also written to ``build_info.json``."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    t0 = time.time()
    p = paths(out)
    os.makedirs(os.path.dirname(p["train"]), exist_ok=True)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(warm["threads"])
    try:
        for name, rows in splits.items():
            task.write_jsonl(p[name], rows)
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(Qwen3Config(**config_kwargs)).to(getattr(torch, warm["dtype"]))
        n_params = sum(x.numel() for x in model.parameters())
        log(
            f"[tiny] {n_params / 1e6:.2f}M params; warm start: {warm['steps']} supervised steps in {warm['dtype']}"
        )
        result = warm_start(model, tok, supervised, warm, seed, log=log)
        result["trained_sha256"] = weights_digest(model)  # before the cast: every last bit of the training
        model = model.to(torch.bfloat16)
        readings = measure(model, tok)
        model.config.dtype = "bfloat16"
        model.generation_config.eos_token_id = EOS_ID
        model.generation_config.pad_token_id = PAD_ID
        model.save_pretrained(p["model"], safe_serialization=True)
        tok.save_pretrained(p["model"])
    finally:
        torch.set_num_threads(threads_before)
    info = {
        **header,
        "params": n_params,
        "model_config": config_kwargs,
        "splits": {name: len(rows) for name, rows in splits.items()},
        "warm_start": {**result, **readings, **warm},
        "arithmetic_used": arithmetic_used(),
        "build_seconds": round(time.time() - t0, 1),
    }
    with open(p["info"], "w") as f:
        json.dump(info, f, indent=1)
    return info
