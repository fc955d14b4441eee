"""benchmarks/gpu_actor.py at tiny size on CPU: the table is printed, its numbers agree with the lengths,
the pruning rule and the packer, and a packed row computes what the padded micro-batch computes."""

import contextlib
import importlib.util
import io
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_actor.py"
_spec = importlib.util.spec_from_file_location("gpu_actor", PATH)
ga = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("gpu_actor", ga)  # dataclasses look their module up in sys.modules
_spec.loader.exec_module(ga)

SEED = 3
ARGV = [
    "--size", "tiny", "--device", "cpu", "--threads", "1", "--seed", str(SEED), "--prompts", "4", "--group", "8",
    "--max-response", "64", "--warmup", "1", "--repeats", "2", "--fractions", "1.0", "0.7", "0.5", "0.3",
]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_actor") / "out.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        result = ga.main([*ARGV, "--json", str(out)])
    return result, buf.getvalue(), json.loads(out.read_text())


def test_tiny_run_prints_the_table_with_one_row_per_arm_and_writes_the_same_rows_to_json(tiny_run):
    result, stdout, from_json = tiny_run
    assert "| arm | kept frac | sequences | tokens | kept-token ratio (ideal) |" in stdout
    for arm in ("grpo padded", "packed 1", "packed 0.7", "packed 0.5", "packed 0.3"):
        assert sum(line.startswith(f"| {arm} |") for line in stdout.splitlines()) == 1, arm
    assert "check (" in stdout and "control (no position restart)" in stdout
    assert [r["arm"] for r in from_json["rows"]] == [r["arm"] for r in result["rows"]]
    assert from_json["rows"][2]["tokens"] == result["rows"][2]["tokens"]
    # CPU: never flash-attn, even where the repo's stand-in makes `import flash_attn` work
    assert from_json["env"]["attn"] == "sdpa"


def test_kept_tokens_density_and_micro_batch_counts_agree_with_the_lengths_and_the_packer(tiny_run):
    result, _, _ = tiny_run
    cfg = result["config"]
    prompt_lens, lens = ga.cot_lengths(
        4, 8, cfg["prompt_min"], cfg["prompt_max"], 64, cfg["response_median"], cfg["sigma"], cfg["cap_frac"],
        np.random.default_rng(SEED),
    )  # fmt: skip
    n, total, cap = lens.size, int(lens.sum()), cfg["capacity"]
    assert cap == 4 * (cfg["prompt_max"] + 64)
    assert result["lengths"]["total_tokens"] == total
    grpo, packed = result["rows"][0], result["rows"][1:]
    # padded: micro-batches of 4 in arrival order, density = real / padded tokens
    padded_slots = sum(len(lens[s : s + 4]) * int(lens[s : s + 4].max()) for s in range(0, n, 4))
    assert grpo["micro_batches"] == math.ceil(n / 4) and grpo["tokens"] == total
    assert grpo["density"] == pytest.approx(total / padded_slots, rel=1e-12)
    assert grpo["time_ratio"] == 1.0 and grpo["kept_token_ratio"] == 1.0
    for row, frac in zip(packed, (1.0, 0.7, 0.5, 0.3)):
        kept = ga.prune_uniform(n, frac, SEED)
        assert row["sequences"] == round(frac * n) == kept.size
        assert row["tokens"] == int(lens[kept].sum())
        assert row["kept_token_ratio"] == pytest.approx(row["tokens"] / total, rel=1e-12)
        assert 0.0 < row["density"] <= 1.0
        assert row["density"] == pytest.approx(row["tokens"] / (row["micro_batches"] * cap), rel=1e-12)
        assert row["micro_batches"] >= row["lower_bound"] >= math.ceil(row["tokens"] / cap)
    # nested uniform subsets: fewer kept sequences never hold more tokens
    assert [r["tokens"] for r in packed] == sorted((r["tokens"] for r in packed), reverse=True)
    # packing alone (fraction 1) needs fewer micro-batches than padding here
    assert packed[0]["micro_batches"] < grpo["micro_batches"]


def test_timings_are_positive_medians_of_the_repeats_and_ratios_are_against_grpo(tiny_run):
    result, _, _ = tiny_run
    base = result["rows"][0]["median_s"]
    for row in result["rows"]:
        assert len(row["times_s"]) == 2 and min(row["times_s"]) > 0
        assert row["min_s"] <= row["median_s"] <= row["max_s"]
        assert row["time_ratio"] == pytest.approx(row["median_s"] / base, rel=1e-12)
        assert row["peak_gib"] is None  # CPU: no CUDA peak memory


def test_the_runs_own_check_finds_packed_equal_to_padded_and_the_unrestarted_control_different(tiny_run):
    check = tiny_run[0]["check"]
    assert len(check["sequences"]) == 4
    assert check["packed_max_abs_logp_diff"] < 1e-5
    assert check["packed_loss_rel_diff"] < 1e-6
    assert check["control_max_abs_logp_diff"] > 1e-2
    assert check["packed_ok"] is True


def _sequences(n, seed):
    gen = torch.Generator().manual_seed(seed)
    lens = [5, 9, 3, 12, 7][:n]
    prompt_lens = np.array([2, 4, 1, 5, 3][:n])
    seqs = [torch.randint(0, ga.TINY["vocab_size"], (k,), generator=gen) for k in lens]
    weight = np.array([1.0, -1.0, 0.5, -2.0, 1.5][:n]) / 10
    return seqs, prompt_lens, weight


def test_a_packed_row_gives_the_padded_log_probs_loss_and_gradients_under_sdpa():
    torch.manual_seed(0)
    model = ga.make_model(ga.TINY, "sdpa", torch.float32, "cpu", grad_ckpt=False)
    seqs, prompt_lens, weight = _sequences(5, seed=1)
    ids = list(range(5))
    out = {}
    for name, packed, restart in (("padded", False, True), ("packed", True, True), ("control", True, False)):
        mb = ga.build(ids, seqs, prompt_lens, weight, packed, "cpu", restart=restart)
        model.zero_grad(set_to_none=True)
        loss, logp = ga.forward_loss(model, mb)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        out[name] = (loss.detach(), ga.response_logps(mb, logp.detach(), prompt_lens, seqs), grads)
    for i in ids:
        assert out["packed"][1][i].shape == (len(seqs[i]) - prompt_lens[i],)
        torch.testing.assert_close(out["packed"][1][i], out["padded"][1][i], rtol=0, atol=1e-5)
    torch.testing.assert_close(out["packed"][0], out["padded"][0], rtol=1e-6, atol=1e-7)
    scale = out["padded"][2].abs().max()
    assert (out["packed"][2] - out["padded"][2]).abs().max() <= 1e-5 * scale
    # without the position restart the later sequences attend to the earlier ones: a different result
    assert max((out["control"][1][i] - out["padded"][1][i]).abs().max() for i in ids[1:]) > 1e-2
    torch.testing.assert_close(out["control"][1][0], out["padded"][1][0], rtol=0, atol=1e-5)


def test_the_check_flags_a_packed_row_whose_sequences_see_each_other(monkeypatch):
    torch.manual_seed(0)
    model = ga.make_model(ga.TINY, "sdpa", torch.float32, "cpu", grad_ckpt=False)
    seqs, prompt_lens, weight = _sequences(3, seed=2)
    real_build = ga.build
    monkeypatch.setattr(ga, "build", lambda *a: real_build(*a[:6], False))  # positions never restart
    check = ga.check_packed_equals_padded(model, seqs, prompt_lens, weight, [0, 1, 2], "cpu")
    assert check["packed_ok"] is False
    assert check["packed_max_abs_logp_diff"] == check["control_max_abs_logp_diff"] > 1e-2


def test_build_restarts_positions_per_sequence_and_weights_only_the_response_predictions():
    seqs = [torch.tensor([11, 12, 13]), torch.tensor([21, 22, 23, 24])]
    prompt_lens, weight = np.array([1, 2]), np.array([0.5, -1.0])
    packed = ga.build([0, 1], seqs, prompt_lens, weight, True, "cpu")
    assert packed.attention_mask is None and packed.tokens == 7 and packed.spans == [(0, 0, 0), (1, 0, 3)]
    assert packed.input_ids.tolist() == [[11, 12, 13, 21, 22, 23, 24]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2, 3]]
    # seq 0 (prompt 1): positions 0, 1 predict 12, 13; seq 1 (prompt 2): positions 3+1, 3+2 predict 23, 24
    assert packed.targets.tolist() == [[12, 13, 0, 0, 23, 24, 0]]
    assert packed.weights.tolist() == [[0.5, 0.5, 0.0, 0.0, -1.0, -1.0, 0.0]]
    padded = ga.build([0, 1], seqs, prompt_lens, weight, False, "cpu")
    assert padded.input_ids.tolist() == [[11, 12, 13, 0], [21, 22, 23, 24]]
    assert padded.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert padded.targets.tolist() == [[12, 13, 0, 0], [0, 23, 24, 0]]
    assert padded.weights.tolist() == [[0.5, 0.5, 0.0, 0.0], [0.0, -1.0, -1.0, 0.0]]


def test_uniform_pruning_keeps_round_frac_n_distinct_sorted_indices_nested_across_fractions():
    subsets = {f: ga.prune_uniform(100, f, seed=5) for f in (0.3, 0.5, 0.7, 1.0)}
    for f, kept in subsets.items():
        assert kept.size == round(100 * f) and np.unique(kept).size == kept.size
        assert (np.diff(kept) > 0).all() and kept.min() >= 0 and kept.max() < 100
    assert set(subsets[0.3]) <= set(subsets[0.5]) <= set(subsets[0.7])
    assert ga.prune_uniform(3, 0.01, seed=0).size == 1  # never an empty batch
    assert not np.array_equal(ga.prune_uniform(100, 0.5, seed=5), ga.prune_uniform(100, 0.5, seed=6))


def test_cot_lengths_share_the_prompt_within_a_group_and_keep_responses_in_range():
    prompt, total = ga.cot_lengths(500, 8, 100, 300, 4096, 0.12, 0.8, 0.05, np.random.default_rng(0))
    resp = total - prompt
    assert (prompt.reshape(500, 8) == prompt.reshape(500, 8)[:, :1]).all()
    assert prompt.min() >= 100 and prompt.max() <= 300
    assert resp.min() >= 1 and resp.max() == 4096
    # long tail: most responses a few hundred tokens, about 5% (+ the log-normal's tail) at the cap
    assert 300 <= np.median(resp) <= 700
    assert 0.04 <= (resp == 4096).mean() <= 0.07


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--capacity", "50"], "--capacity 50"),
        (["--fractions", "0.5", "0"], "--fractions"),
        (["--attn", "flash_attention_2"], "--attn flash_attention_2"),
        (["--layers", "0"], "--layers"),
    ],
)
def test_bad_flags_stop_with_a_message_naming_the_flag(extra, words, capsys):
    with pytest.raises(SystemExit) as exc:
        ga.main(["--size", "tiny", "--device", "cpu", *extra])
    message = str(exc.value.code) + capsys.readouterr().err
    assert words in message
