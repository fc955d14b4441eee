"""The embedded tiny task: disjoint splits, the tokenizer, the model sizes and the cached build."""

from __future__ import annotations

import json
import os

import pytest

from openrlhf_dppo.tiny import arithmetic, build, task
from openrlhf_dppo.tiny import warm as warm_start_mod


def _inputs(rows):
    return [r["input"] for r in rows]


def test_split_is_deterministic_for_a_seed_and_differs_across_seeds():
    assert task.split(3, 50, 20, 100) == task.split(3, 50, 20, 100)
    assert _inputs(task.split(3, 50, 20, 100)["eval"]) != _inputs(task.split(4, 50, 20, 100)["eval"])


def test_splits_are_disjoint_and_cover_every_two_digit_sum_once():
    parts = task.split(0, build.N_EVAL, build.N_DEV, build.N_TRAIN)
    sizes = {name: len(rows) for name, rows in parts.items()}
    assert sizes == {"eval": 500, "dev": 200, "train": 2000, "warm": 10_000 - 2700}
    seen = [p for rows in parts.values() for p in _inputs(rows)]
    assert len(seen) == len(set(seen)) == 10_000
    held_out = set(_inputs(parts["eval"]))
    for name in ("dev", "train", "warm"):
        assert not held_out & set(_inputs(parts[name])), f"a held-out prompt is in {name}"


def test_labels_are_the_sums():
    for row in task.split(1, 10, 10, 10)["warm"][:300]:
        a, b = row["input"].removesuffix("=").split("+")
        assert row["label"] == str(int(a) + int(b)) and 0 <= int(a) < 100 and 0 <= int(b) < 100


def test_the_held_out_set_spans_easy_and_hard_problems():
    rows = task.split(0, build.N_EVAL, build.N_DEV, build.N_TRAIN)["eval"]
    one_digit = sum(len(r["label"]) == 1 for r in rows)
    three_digit = sum(len(r["label"]) == 3 for r in rows)
    assert one_digit >= 1 and three_digit >= 100  # from "3+4=" to double carries such as "97+58="


def test_split_rejects_more_prompts_than_the_space_holds():
    with pytest.raises(ValueError, match="exceeds the 100 problems of 1-digit addition"):
        task.split(0, 50, 30, 30, digits=1)


def test_tokenizer_round_trip():
    from openrlhf_dppo.tiny.tokenizer import EOS_ID, build_tokenizer

    tok = build_tokenizer()
    ids = tok("73+8=", add_special_tokens=False)["input_ids"]
    assert len(ids) == 5
    assert tok.decode(ids + [EOS_ID], skip_special_tokens=False) == "73+8=<eos>"


def test_model_sizes_by_name_and_by_dimensions():
    xs = build.model_config("xs")
    assert (xs["hidden_size"], xs["num_hidden_layers"], xs["intermediate_size"]) == (128, 2, 384)
    assert (xs["num_attention_heads"], xs["num_key_value_heads"], xs["head_dim"]) == (2, 1, 64)
    assert build.model_config("256x4x1024") == build.model_config("m")
    assert build.model_config("m", tie_word_embeddings=False)["tie_word_embeddings"] is False
    for bad in ("huge", "100x2x384", "128x0x384", "128x2"):
        with pytest.raises(ValueError, match="--size"):
            build.parse_size(bad)


@pytest.mark.parametrize("size, params", [("xs", 396_160), ("s", 1_578_496)])
def test_parameter_counts_of_the_named_sizes(size, params):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(Qwen3Config(**build.model_config(size)))
    assert sum(p.numel() for p in model.parameters()) == params


def test_build_fingerprint_tracks_seed_warm_start_and_size():
    base = build.fingerprint(0, build.WARM)
    assert base == build.fingerprint(0, dict(build.WARM), "s")
    assert base != build.fingerprint(1, build.WARM)
    assert base != build.fingerprint(0, dict(build.WARM, lr=1e-3))
    assert base != build.fingerprint(0, dict(build.WARM, steps=build.WARM["steps"] + 1))
    assert base != build.fingerprint(0, dict(build.WARM, dtype="float32"))
    assert base != build.fingerprint(0, build.WARM, "xs")


def test_the_fingerprint_reads_the_sources_code_not_their_docstrings_or_comments(tmp_path):
    import hashlib

    from openrlhf_dppo.tiny.assets import hash_sources

    def digest(text: str) -> str:
        path = tmp_path / "m.py"
        path.write_text(text)
        h = hashlib.sha256()
        hash_sources(h, [str(path)])
        return h.hexdigest()

    code = '"""Module."""\n\n\ndef f(x):\n    """Doubles."""\n    return 2 * x  # twice\n'
    assert digest(code) == digest(code.replace("Doubles.", "Twice x.").replace("# twice", "# 2x"))
    assert digest(code) == digest(code.replace('"""Module."""\n', "").replace("  # twice", ""))
    assert digest(code) != digest(code.replace("2 * x", "3 * x"))
    assert digest('def f():\n    """Only a docstring."""\n') == digest("def f():\n    pass\n")


def test_the_warm_start_loss_is_the_models_own_in_its_own_dtype():
    """transformers' built-in loss casts the logits to fp32, which would undo a float64 warm start."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from openrlhf_dppo.tiny.tokenizer import build_tokenizer

    rows = task.split(0, 10, 10, 10)["warm"][:8]
    ids, mask, labels = warm_start_mod._encode(
        build_tokenizer(), [r["input"] for r in rows], [r["label"] for r in rows]
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**build.model_config("xs")))
    ours = warm_start_mod._next_token_loss(model, ids, mask, labels)
    theirs = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert ours.dtype == torch.float32 and torch.allclose(ours, theirs, rtol=1e-6, atol=0)
    assert warm_start_mod._next_token_loss(model.double(), ids, mask, labels).dtype == torch.float64


def test_in_the_warm_start_the_norms_compute_in_float64_and_after_it_as_transformers_does():
    """transformers' Qwen3RMSNorm rounds its input to fp32 even in a float64 model."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(Qwen3Config(**build.model_config("xs"))).double()
    norm = model.model.norm
    x = torch.randn(3, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 1e3 + 1.0 / 3
    exact = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    with warm_start_mod._norms_in_model_dtype(model):
        assert norm(x).equal(exact)
    assert not norm(x).equal(exact)  # transformers' own again: fp32 arithmetic
    assert (norm(x) - exact).abs().max() < 1e-5


def test_two_builds_give_identical_weights(tmp_path):
    """Same seed, same machine: bit-identical weights and the same readings (a 40-step warm start of the
    small size, so that it runs in seconds; the rule is the same at every size and step count)."""
    from safetensors.torch import load_file

    warm = dict(build.WARM, steps=40, log_every=20)
    infos, weights = [], []
    for name in ("a", "b"):
        out = str(tmp_path / name)
        infos.append(build.build(out, seed=0, warm=warm, size="xs", log=lambda *_: None))
        weights.append(load_file(os.path.join(build.paths(out)["model"], "model.safetensors")))
    a, b = weights
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].equal(b[key]), key
    infos[0].pop("build_seconds"), infos[1].pop("build_seconds")
    assert infos[0] == infos[1]
    assert infos[0]["warm_start"]["steps"] == 40 and infos[0]["warm_start"]["dtype"] == "float64"


def test_a_short_build_writes_disjoint_data_and_is_cached(tmp_path):
    """A build with a 3-step warm start (the real one takes a few minutes): the files on disk keep the
    held-out set apart from the training pool and the warm-start data, and a second call reuses them."""
    out = str(tmp_path / "tiny")
    warm = dict(build.WARM, steps=3)
    info = build.build(out, seed=0, warm=warm, log=lambda *_: None)
    p = build.paths(out)
    rows = {name: task.read_jsonl(p[name]) for name in task.SPLITS}
    held_out = set(_inputs(rows["eval"]))
    assert len(held_out) == 500
    assert not held_out & set(_inputs(rows["train"])) and not held_out & set(_inputs(rows["warm"]))
    assert info["warm_start"]["steps"] == 3 and info["size"] == build.DEFAULT_SIZE == "s"
    assert info["params"] == 1_578_496
    with open(os.path.join(p["model"], "config.json")) as f:
        assert json.load(f)["dtype"] == "bfloat16"  # the engine's dtype
    assert build.is_built(out, seed=0, warm=warm)
    assert not build.is_built(out, seed=1, warm=warm)
    mtime = os.path.getmtime(p["info"])
    assert build.ensure_built(out, seed=0, warm=warm) == info
    assert os.path.getmtime(p["info"]) == mtime  # cached: not rebuilt


def _weights(out):
    from safetensors.torch import load_file

    return load_file(os.path.join(build.paths(out)["model"], "model.safetensors"))


def _build_under(tmp_path, name, env, warm):
    """A build in a child process that computes with exactly ``env``'s kernels (no pinned grandchild);
    returns (build_info, saved bf16 weights)."""
    import subprocess
    import sys

    out = str(tmp_path / name)
    spec = json.dumps({"warm": warm, "extra": {}})
    cmd = [sys.executable, "-m", "openrlhf_dppo.tiny.build", "--out", out, "--spec", spec]
    clean = {k: v for k, v in os.environ.items() if k not in (*_EMULATE, *arithmetic.PINNED_ENV)}
    child = {"OPENRLHF_DPPO_TINY_BUILD_CHILD": "1"}
    subprocess.run(cmd, env={**clean, **env, **child}, check=True, capture_output=True)
    with open(build.paths(out)["info"]) as f:
        return json.load(f), _weights(out)


_EMULATE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# kernels that sum in different orders, as two CPUs' do where ATen's pin cannot reach: MKL's dgemm on its
# AVX2 and on its SSE2 code path (MKL picks its kernels by CPU model, so an Intel and an AMD CPU run
# different ones under the same MKL_CBWR), and this machine's own, unpinned kernels. ATen's kernels stay
# pinned to AVX2: its scalar kernels differ from the vector ones by more than the rounding absorbs.
_KERNELS = {
    "pinned": dict(arithmetic.PINNED_ENV),
    "mkl_sse2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"},
    "own": {},
}


def test_a_build_is_the_same_whatever_kernels_compute_it(tmp_path):
    """The warm start rounds its state to WARM["state_bits"] significant bits after every step, so builds
    whose matrix products sum in different orders (MKL's AVX2 and SSE2 dgemm, this CPU's own kernels) end
    with the same float64 weights, bit for bit. The control: without the rounding the builds on MKL's two
    paths differ, so they really do compute differently here (benchmarks/INFRA.md, "Warm start")."""
    warm = dict(build.WARM, steps=30, log_every=10)  # the default size, 30 steps: seconds
    assert warm["state_bits"] == 12
    rounded = {k: _build_under(tmp_path, f"r_{k}", env, warm) for k, env in _KERNELS.items()}
    digests = {k: info["warm_start"]["trained_sha256"] for k, (info, _) in rounded.items()}
    assert len(set(digests.values())) == 1, digests
    (_, a), *others = rounded.values()
    assert all(a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a) for _, b in others)
    info_pinned, _ = rounded["pinned"]
    assert info_pinned["arithmetic_used"] == {
        "torch_cpu_capability": "AVX2",
        "mkl_cbwr": "AVX2",
        "pinned_avx2": True,
    }
    assert rounded["mkl_sse2"][0]["arithmetic_used"]["mkl_cbwr"] == "COMPATIBLE"

    plain = dict(warm, state_bits=None)
    unrounded = {k: _build_under(tmp_path, f"u_{k}", env, plain)[0] for k, env in _KERNELS.items()}
    digests = {k: info["warm_start"]["trained_sha256"] for k, info in unrounded.items()}
    assert digests["pinned"] != digests["mkl_sse2"], f"MKL's two code paths gave the same weights: {digests}"


def test_a_build_is_the_same_on_a_cpu_without_avx512_or_native_bf16(tmp_path):
    """The pinned build under the emulation of an AVX2-only CPU (ATen's kernels and oneDNN capped at AVX2,
    as on an AMD Zen 3) has the same weights, bit for bit, as the pinned build on this CPU."""
    warm = dict(build.WARM, steps=30, log_every=10)
    (info_a, a) = _build_under(tmp_path, "native", dict(arithmetic.PINNED_ENV), warm)
    (info_b, b) = _build_under(tmp_path, "avx2_only", {**_EMULATE, **arithmetic.PINNED_ENV}, warm)
    assert info_a["arithmetic_used"] == info_b["arithmetic_used"]
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)  # the saved bf16 weights
    assert info_b["warm_start"]["trained_sha256"] == info_a["warm_start"]["trained_sha256"]  # before the cast
    assert info_a["fingerprint"] == info_b["fingerprint"]


def test_a_build_from_an_unpinned_process_runs_in_a_pinned_child(tmp_path, monkeypatch):
    """``build()`` called in a process whose kernels are not pinned (this test process) hands the build to
    a child under ``PINNED_ENV``, and its info says so."""
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    if arithmetic.arithmetic_used()["pinned_avx2"]:
        pytest.skip("this test process already runs the pinned arithmetic")
    assert arithmetic.needs_pinned_child(dict(build.WARM)) and not arithmetic.needs_pinned_child(
        dict(build.WARM, arithmetic=None)
    )
    info = build.build(
        str(tmp_path / "t"), seed=0, warm=dict(build.WARM, steps=3), size="xs", log=lambda *_: None
    )
    assert info["arithmetic_used"]["pinned_avx2"] is True


def test_state_rounding_is_round_to_nearest_on_a_grid_of_that_many_significant_bits():
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(10_000, dtype=torch.float64, generator=g) * torch.logspace(
        -8, 2, 10_000, dtype=torch.float64
    )
    for bits in (12, 24):
        y = x.clone()
        warm_start_mod.round_to_bits([y], bits)
        mant, exp = torch.frexp(x)  # x = mant * 2^exp, 0.5 <= |mant| < 1
        scale = torch.pow(torch.tensor(2.0, dtype=torch.float64), exp.double())
        lo = torch.floor(mant * 2**bits) / 2**bits * scale  # the two grid points around x
        hi = lo + scale / 2**bits
        assert bool(((y == lo) | (y == hi)).all())  # y is on the grid, next to x
        assert bool(((y - x).abs() <= (hi - lo) / 2).all())  # and the nearer of the two
        again = y.clone()
        warm_start_mod.round_to_bits([again], bits)
        assert again.equal(y)  # a grid point stays put
    y = x.clone()
    warm_start_mod.round_to_bits([y], 24)
    assert y.equal(x.float().double())  # 24 bits: float32's own rounding
    with pytest.raises(ValueError, match="state_bits"):
        warm_start_mod.round_to_bits([x.clone()], 53)
    with pytest.raises(TypeError, match="float64"):
        warm_start_mod.round_to_bits([x.float()], 12)


def test_the_warm_start_rounds_the_parameters_and_both_adam_moments():
    import torch

    model = torch.nn.Linear(4, 3).double()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 4, dtype=torch.float64)).pow(2).sum().backward()
    opt.step()
    state = warm_start_mod.training_state(model, opt)
    assert len(state) == 3 * len(list(model.parameters()))
    with torch.no_grad():  # as in the warm start's step
        warm_start_mod.round_to_bits(state, 12)
    for t in state:
        mant, _ = torch.frexp(t)
        assert (mant * 2**12).equal(torch.round(mant * 2**12))
