"""The supervised warm start of the tiny builds: a fixed number of next-token steps in the model's dtype."""

from __future__ import annotations

import contextlib
import functools

from openrlhf_dppo.tiny.tokenizer import EOS_ID, PAD_ID


def _encode(tok, prompts, answers):
    """Right-padded batch for the supervised loss: (input_ids (B,T), attention_mask (B,T), labels (B,T))."""
    import torch

    rows, lab = [], []
    for p, a in zip(prompts, answers):
        ids = tok(p, add_special_tokens=False)["input_ids"]
        ans = tok(a, add_special_tokens=False)["input_ids"] + [EOS_ID]
        rows.append(ids + ans)
        lab.append([-100] * len(ids) + ans)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
        labels[i, : len(r)] = torch.tensor(lab[i])
    return ids, mask, labels


def _next_token_loss(model, ids, mask, labels):
    """Mean next-token cross-entropy over the answer tokens, in the model's own dtype (transformers' loss
    casts to fp32). ids, mask, labels: (B, T) as from ``_encode``."""
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]  # (B, T-1, V): predicts t+1
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


def _rms_norm(norm, x):
    """transformers' Qwen3RMSNorm with the arithmetic in ``x``'s dtype; x: (..., hidden)."""
    import torch

    return norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))


@contextlib.contextmanager
def _norms_in_model_dtype(model):
    """Within the block, the model's RMSNorms compute in the model's dtype, not fp32 (per instance)."""
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    for norm in norms:
        norm.forward = functools.partial(_rms_norm, norm)
    try:
        yield
    finally:
        for norm in norms:
            del norm.forward


def warm_start(model, tok, warm_rows: list[dict], warm: dict, seed: int, probe=None, log=print) -> dict:
    """Supervised next-token training on ``warm_rows`` for exactly ``warm["steps"]`` steps, norms in the
    model's dtype, batches of ``warm["batch_size"]`` drawn with replacement (seeded), the state rounded
    to ``warm["state_bits"]`` after each step when set. ``probe(step, model)`` is called every
    ``warm["log_every"]`` steps and after the last. Returns ``{"steps", "final_loss"}``.
    """
    import random

    import torch

    rng = random.Random(seed + 3)
    opt = torch.optim.AdamW(model.parameters(), lr=warm["lr"], weight_decay=0.0)
    loss = torch.zeros(())
    with _norms_in_model_dtype(model):
        for step in range(1, warm["steps"] + 1):
            loss = _warm_step(model, tok, warm_rows, warm, rng, opt)
            if step % warm["log_every"] == 0 or step == warm["steps"]:
                log(f"[tiny] warm-start step {step}/{warm['steps']} loss {loss.item():.3f}")
                if probe is not None:
                    probe(step, model)
    return {"steps": warm["steps"], "final_loss": round(loss.item(), 6)}


def _warm_step(model, tok, warm_rows, warm, rng, opt):
    """One supervised step on a batch drawn with replacement by ``rng``; returns the loss (detached)."""
    import torch

    batch = [warm_rows[rng.randrange(len(warm_rows))] for _ in range(warm["batch_size"])]
    ids, mask, labels = _encode(tok, [r["input"] for r in batch], [r["label"] for r in batch])
    loss = _next_token_loss(model, ids, mask, labels)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if warm.get("state_bits"):
        with torch.no_grad():
            round_to_bits(training_state(model, opt), warm["state_bits"])
    return loss.detach()


def training_state(model, opt) -> list:
    """Every tensor the next step starts from: the parameters and AdamW's two moments."""
    state = list(model.parameters())
    for p in model.parameters():
        s = opt.state.get(p, {})
        state += [s[k] for k in ("exp_avg", "exp_avg_sq") if k in s]
    return state


def round_to_bits(tensors, bits: int) -> None:
    """Round each float64 tensor in place to ``bits`` significant bits (round to nearest, Veltkamp's
    split: c - (c - x) with c = (2^(53 - bits) + 1) x). ValueError for bits outside [1, 52], TypeError
    for a tensor that is not float64."""
    import torch

    if not 1 <= bits <= 52:
        raise ValueError(f"state_bits must be in [1, 52], got {bits}")
    split = float(2 ** (53 - bits) + 1)
    for t in tensors:
        if t.dtype != torch.float64:
            raise TypeError(f"state rounding works on float64 tensors, got {t.dtype}")
        c = t * split
        t.copy_(c - (c - t))
