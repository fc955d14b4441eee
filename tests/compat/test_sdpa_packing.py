"""Why ``sdpa_for_flash_attn`` is exact: OpenRLHF's packed forward computes the same logits under sdpa."""

from __future__ import annotations

import torch


def test_sdpa_packed_forward_equals_separate_sequences():
    """OpenRLHF's packed forward (attention_mask=None, per-sequence position ids, use_cache=False) under
    sdpa gives each sequence the logits it gets alone."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=16, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, max_position_embeddings=64, use_cache=False,
    )  # fmt: skip
    model = Qwen3ForCausalLM(cfg).float().eval()
    model.config._attn_implementation = "sdpa"
    seqs = [torch.randint(0, 16, (n,)) for n in (5, 7, 3)]
    packed = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    with torch.no_grad():
        out = model(packed, attention_mask=None, position_ids=pos, use_cache=False).logits[0]
        alone = torch.cat([model(s[None], use_cache=False).logits[0] for s in seqs])
    torch.testing.assert_close(out, alone, rtol=1e-5, atol=1e-5)
    # and the packing is really seen: one position stream over the whole row gives different logits
    with torch.no_grad():
        joined = model(
            packed, attention_mask=None, position_ids=torch.arange(15)[None], use_cache=False
        ).logits[0]
    assert not torch.allclose(joined[5:], alone[5:], atol=1e-3)
