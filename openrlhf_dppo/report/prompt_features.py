"""Features of a prompt known before its first rollout, for ``report.unseen_score``: hashed character
n-grams of its text, the last hidden state of a model's prompt-only forward, a named dataset field."""

from __future__ import annotations

import json
import time
import zlib

import numpy as np
import torch

NGRAM_DIM = 1024
NGRAM_N = (1, 2, 3, 4)


def ngram_features(texts: list[str], dim: int = NGRAM_DIM, ns: tuple[int, ...] = NGRAM_N) -> np.ndarray:
    """(N, dim) hashed character n-grams (signed, crc32: the same on every machine), rows of unit norm."""
    out = np.zeros((len(texts), dim))
    for row, text in enumerate(texts):
        for n in ns:
            for i in range(len(text) - n + 1):
                h = zlib.crc32(text[i : i + n].encode())
                out[row, h % dim] += 1.0 if (h >> 31) & 1 else -1.0
    norm = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norm > 0, norm, 1.0)


def field_features(rows: list[dict], name: str) -> np.ndarray:
    """(N, K) one-hot of the field ``name``'s K values; a row without it raises naming the field."""
    missing = [i for i, r in enumerate(rows) if name not in r]
    if missing:
        raise ValueError(f"field:{name}: row {missing[0]} of the data has no field {name!r}")
    values = sorted({json.dumps(r[name], sort_keys=True) for r in rows})
    col = {v: k for k, v in enumerate(values)}
    out = np.zeros((len(rows), len(values)))
    out[np.arange(len(rows)), [col[json.dumps(r[name], sort_keys=True)] for r in rows]] = 1.0
    return out


def hidden_features(texts: list[str], model_dir: str, batch: int = 64) -> tuple[np.ndarray, dict]:
    """(N, H) the last hidden state of each prompt's last token (one prompt-only forward, fp32, CPU),
    standardised per column; and the measured cost: seconds per batch of ``batch`` prompts, prompt tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    feats, seconds, tokens = [], [], []
    with torch.no_grad():
        for start in range(0, len(texts), batch):
            chunk = texts[start : start + batch]
            ids = [tok(t, add_special_tokens=False)["input_ids"] for t in chunk]
            width = max(len(x) for x in ids)
            pad = tok.pad_token_id if tok.pad_token_id is not None else 0
            inp = torch.tensor([[pad] * (width - len(x)) + x for x in ids])  # left pad: last token at -1
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            t0 = time.perf_counter()
            out = model(input_ids=inp, attention_mask=mask, output_hidden_states=True)
            seconds.append(time.perf_counter() - t0)
            feats.append(out.hidden_states[-1][:, -1].double().numpy())
            tokens += [len(x) for x in ids]
    x = np.concatenate(feats)
    x = (x - x.mean(axis=0)) / np.maximum(x.std(axis=0), 1e-8)
    full = [s for s, start in zip(seconds, range(0, len(texts), batch)) if len(texts) - start >= batch]
    cost = {
        "seconds_per_batch": float(np.median(full or seconds)),
        "batch": batch,
        "prompt_tokens": float(np.mean(tokens)),
        "params": int(sum(p.numel() for p in model.parameters())),
    }
    return x, cost
