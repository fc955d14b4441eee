"""Fast checks of the CPU layer and the tiny assets' pieces (no Ray, no vLLM engine; seconds).

The full pipeline is exercised by test_tiny_pipeline.py (marked e2e); these pin the parts whose
failure there would be hard to read: the gloo broadcast, the digest split of fused vLLM weights, the
watchdog's verdict, the switches, the reward, the task's determinism and the two demo scripts.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time

import pytest
import torch

from openrlhf_dppo.compat import cpu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _receiver(port, q):
    group = cpu.GlooBroadcastGroup("127.0.0.1", port, 1, 2, timeout_s=60)
    t = torch.empty((3, 5), dtype=torch.bfloat16)
    group.broadcast(t, src=0)
    q.put(t.float().tolist())


def test_gloo_broadcast_delivers_bf16_bytes():
    port = _free_port()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_receiver, args=(port, q))
    p.start()
    sent = torch.randn(3, 5, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    group = cpu.GlooBroadcastGroup("127.0.0.1", port, 0, 2, timeout_s=60)
    group.broadcast(sent.clone(), src=0)
    got = torch.tensor(q.get(timeout=60)).to(torch.bfloat16)
    p.join(timeout=30)
    assert p.exitcode == 0
    assert torch.equal(got, sent)


def _lonely_receiver(port, q):
    group = cpu.GlooBroadcastGroup("127.0.0.1", port, 1, 2, timeout_s=3)
    try:
        group.broadcast(torch.empty(4), src=0)  # rank 0 never sends: must time out, not hang
        q.put("returned")
    except RuntimeError as e:
        q.put(str(e))


def test_gloo_broadcast_times_out_with_a_clear_message():
    port = _free_port()
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_lonely_receiver, args=(port, q))
    p.start()
    group = cpu.GlooBroadcastGroup("127.0.0.1", port, 0, 2, timeout_s=60)  # rank 0 joins, never sends
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
        "embed_tokens.weight": cpu.tensor_digest(m.embed_tokens.weight.data[:16]),
        "q_proj.weight": cpu.tensor_digest(qkv[:8]),
        "k_proj.weight": cpu.tensor_digest(qkv[8:12]),
        "v_proj.weight": cpu.tensor_digest(qkv[12:16]),
        "gate_proj.weight": cpu.tensor_digest(gu[:12]),
        "up_proj.weight": cpu.tensor_digest(gu[12:]),
    }
    assert d == expected
    # one changed element in the v slice changes exactly that digest
    with torch.no_grad():
        m.qkv_proj.weight[13, 2] += 1
    d2 = openrlhf_dppo_weight_digests(m)
    assert {k for k in d if d[k] != d2[k]} == {"v_proj.weight"}


def test_tensor_digest_sees_dtype_shape_and_every_bit():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert cpu.tensor_digest(t) == cpu.tensor_digest(t.clone())
    assert cpu.tensor_digest(t) != cpu.tensor_digest(t.reshape(4, 3))
    assert cpu.tensor_digest(t) != cpu.tensor_digest(t.to(torch.float64))
    u = t.clone()
    u[2, 3] = torch.nextafter(u[2, 3], torch.tensor(100.0))
    assert cpu.tensor_digest(t) != cpu.tensor_digest(u)


def test_watchdog_verdicts(tmp_path):
    hb = str(tmp_path / "hb")
    w = cpu.Watchdog(hb, stall_s=10, startup_s=30, on_fire=lambda m: None)
    assert w.check(now=w.started + 29) is None  # starting up
    assert "after start" in w.check(now=w.started + 31)
    with open(hb, "w") as f:
        f.write("weight sync started (pid 1)")
    t = os.path.getmtime(hb)
    assert w.check(now=t + 9) is None
    msg = w.check(now=t + 11)
    assert "weight sync started" in msg and "weight sync is not connected" in msg


def test_watchdog_thread_fires(tmp_path):
    fired = []
    w = cpu.Watchdog(str(tmp_path / "none"), stall_s=0.1, startup_s=0.1, on_fire=fired.append).start()
    w.thread.join(timeout=10)
    assert fired and "no progress" in fired[0]


def test_switches(monkeypatch):
    monkeypatch.setenv(cpu.ENV_DISABLE, "plain_linear, watchdog")
    assert not cpu.enabled("plain_linear") and not cpu.enabled("watchdog") and cpu.enabled("cuda_stubs")
    assert cpu.enabled("plain_linear", {"plain_linear": True})
    with pytest.raises(ValueError, match="unknown CPU patch"):
        cpu.enabled("nope")
    with pytest.raises(ValueError, match="unknown CPU patch"):
        cpu.apply(nope=False)


def test_ray_init_kwargs_merge_runtime_env(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv(cpu.ENV_VERIFY, "/tmp/x.jsonl")
    kw = cpu.ray_init_kwargs(
        {"runtime_env": {"env_vars": {"NCCL_DEBUG": "INFO"}}}, fake_gpus=3, num_cpus=None
    )
    env = kw["runtime_env"]["env_vars"]
    assert kw["num_gpus"] == 3 and kw["num_cpus"] >= 8
    assert kw["runtime_env"]["worker_process_setup_hook"] == "openrlhf_dppo.compat.cpu.worker_setup"
    assert (
        env["NCCL_DEBUG"] == "INFO"
        and env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        and env[cpu.ENV_VERIFY] == "/tmp/x.jsonl"
    )


def test_ray_init_kwargs_join_an_existing_cluster_without_local_resources(monkeypatch):
    # Ray refuses num_gpus / num_cpus / include_dashboard when connecting to a running cluster
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    kw = cpu.ray_init_kwargs({}, fake_gpus=3, num_cpus=None)
    assert not {"num_gpus", "num_cpus", "include_dashboard"} & set(kw)
    assert kw["runtime_env"]["worker_process_setup_hook"] == "openrlhf_dppo.compat.cpu.worker_setup"
    monkeypatch.delenv("RAY_ADDRESS")
    kw = cpu.ray_init_kwargs({"address": "10.0.0.1:6379"}, fake_gpus=3, num_cpus=None)
    assert "num_gpus" not in kw and kw["address"] == "10.0.0.1:6379"


def test_after_import_patches_a_module_on_first_import(tmp_path, monkeypatch):
    (tmp_path / "e5_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    cpu.after_import("e5_probe_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    import e5_probe_mod  # noqa: F401

    assert seen == [1]


def test_arithmetic_reward_contract():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "rf", os.path.join(ROOT, "openrlhf_dppo/rewards/arithmetic.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.reward_func(
        ["12+5=17<eos>", "12+5=17", "12+5=18<eos>", "9+9= 18<eos>", "3+4=7<eos><pad>"],
        ["12+5=", "12+5=", "12+5=", "9+9=", "3+4="],
        ["17", "17", "17", "18", "7"],
    )
    assert out["rewards"].tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    assert torch.equal(out["scores"], out["rewards"])


def test_timing_is_recorded_by_the_heartbeat(tmp_path, monkeypatch):
    hb = tmp_path / "hb"
    monkeypatch.setenv(cpu.ENV_HEARTBEAT, str(hb))
    before = time.time()
    cpu.heartbeat("weight sync done")
    assert hb.read_text().startswith("weight sync done") and os.path.getmtime(hb) >= before - 1


def test_sdpa_packed_forward_equals_separate_sequences():
    """The CPU packing path: OpenRLHF's packed forward (attention_mask=None, per-sequence position ids,
    use_cache=False) under sdpa gives each sequence the logits it gets alone."""
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


def test_apply_is_a_no_op_with_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv(cpu.ENV_ACTIVE, raising=False)
    import ray

    init_before = ray.init
    assert cpu.apply() is False
    assert cpu.ENV_ACTIVE not in os.environ and ray.init is init_before
