"""The trainer -> vLLM weight sync on CPU: the gloo broadcast and the digests that verify it.

The full sync is exercised by tests/e2e/test_tiny_pipeline.py; these pin the parts whose failure there
would be hard to read.
"""

from __future__ import annotations

import multiprocessing as mp
import time

import torch

from openrlhf_dppo.compat.cpu.weight_sync import GlooBroadcastGroup, tensor_digest

# fork, not spawn: under pytest's importlib mode this test module has no importable name
CTX = mp.get_context("fork")


def _receiver(port, q):
    group = GlooBroadcastGroup("127.0.0.1", port, 1, 2, timeout_s=60)
    t = torch.empty((3, 5), dtype=torch.bfloat16)
    group.broadcast(t, src=0)
    q.put(t.float().tolist())


def test_gloo_broadcast_delivers_bf16_bytes(free_port):
    q = CTX.Queue()
    p = CTX.Process(target=_receiver, args=(free_port, q))
    p.start()
    sent = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    group = GlooBroadcastGroup("127.0.0.1", free_port, 0, 2, timeout_s=60)
    group.broadcast(sent.clone(), src=0)
    got = torch.tensor(q.get(timeout=60)).to(torch.bfloat16)
    p.join(timeout=30)
    assert p.exitcode == 0
    assert torch.equal(got, sent)


def _lonely_receiver(port, q):
    group = GlooBroadcastGroup("127.0.0.1", port, 1, 2, timeout_s=3)
    try:
        group.broadcast(torch.empty(4), src=0)  # rank 0 never sends: must time out, not hang
        q.put("returned")
    except RuntimeError as e:
        q.put(str(e))


def test_gloo_broadcast_times_out_with_a_clear_message(free_port):
    q = CTX.Queue()
    p = CTX.Process(target=_lonely_receiver, args=(free_port, q))
    p.start()
    group = GlooBroadcastGroup("127.0.0.1", free_port, 0, 2, timeout_s=60)  # rank 0 joins, never sends
    t0 = time.time()
    msg = q.get(timeout=60)
    waited = time.time() - t0
    p.join(timeout=30)
    del group
    assert "weight broadcast failed or timed out" in msg
    assert 2.0 < waited < 30.0, waited  # the receiver's 3 s timeout, not a hang and not an instant error


class _Fused(torch.nn.Module):
    def __init__(self, sizes, cols):
        super().__init__()
        self.output_sizes = sizes
        self.weight = torch.nn.Parameter(torch.randn(sum(sizes), cols).to(torch.bfloat16))


class _Emb(torch.nn.Module):
    def __init__(self, rows, padded, cols):
        super().__init__()
        self.org_vocab_size = rows
        self.weight = torch.nn.Parameter(torch.randn(padded, cols).to(torch.bfloat16))


class _VllmLike(torch.nn.Module):
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self):
        super().__init__()
        self.embed_tokens = _Emb(16, 64, 8)
        self.qkv_proj = _Fused([8, 4, 4], 8)
        self.gate_up_proj = _Fused([12, 12], 8)


def test_vllm_digests_split_fused_weights_and_drop_vocab_padding():
    from openrlhf_dppo.compat.vllm_worker import openrlhf_dppo_weight_digests

    torch.manual_seed(0)
    m = _VllmLike()
    d = openrlhf_dppo_weight_digests(m)
    qkv, gu = m.qkv_proj.weight.data, m.gate_up_proj.weight.data
    expected = {
        "embed_tokens.weight": tensor_digest(m.embed_tokens.weight.data[:16]),
        "q_proj.weight": tensor_digest(qkv[:8]),
        "k_proj.weight": tensor_digest(qkv[8:12]),
        "v_proj.weight": tensor_digest(qkv[12:16]),
        "gate_proj.weight": tensor_digest(gu[:12]),
        "up_proj.weight": tensor_digest(gu[12:]),
    }
    assert d == expected
    # one changed element in the v slice changes exactly that digest
    with torch.no_grad():
        m.qkv_proj.weight[13, 2] += 1
    d2 = openrlhf_dppo_weight_digests(m)
    assert {k for k in d if d[k] != d2[k]} == {"v_proj.weight"}


def test_tensor_digest_sees_dtype_shape_and_every_bit():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_digest(t) == tensor_digest(t.clone())
    assert tensor_digest(t) != tensor_digest(t.reshape(4, 3))
    assert tensor_digest(t) != tensor_digest(t.to(torch.float64))
    u = t.clone()
    u[2, 3] = torch.nextafter(u[2, 3], torch.tensor(100.0))
    assert tensor_digest(t) != tensor_digest(u)
