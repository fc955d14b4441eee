"""`openrlhf-dppo compare` (and the run-directory writer, and the tiny summary) on a machine without
OpenRLHF, Ray, DeepSpeed, vLLM or torch: a laptop holding run directories copied from the cluster.

Each check runs in a fresh interpreter whose import system refuses those packages (a meta-path finder
placed first raises ImportError for them), so any import of the host, however indirect, fails the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "tiny_cpu"
BLOCKED = ("openrlhf", "ray", "deepspeed", "vllm", "torch", "transformers", "flash_attn", "submitit")
PRELUDE = f"""
import sys
from importlib.abc import MetaPathFinder

class _Refuse(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is not installed on this laptop")
        return None

sys.meta_path.insert(0, _Refuse())
"""


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "MPLBACKEND": "Agg"}
    script = PRELUDE + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_prelude_really_refuses_the_host(tmp_path):
    res = _run("import torch", tmp_path)
    assert res.returncode != 0 and "torch is not installed on this laptop" in res.stderr


def test_compare_runs_without_the_host(tmp_path, rundirs):
    for seed, curve in ((1, [0.25, 0.25, 0.5, 0.5, 0.5]), (2, [0.25, 0.375, 0.375, 0.5, 0.5])):
        rundirs.curve_run(tmp_path / f"grpo_s{seed}", step_time=4.0, evals=curve, seed=seed)
        rundirs.curve_run(tmp_path / f"dppo_s{seed}", step_time=2.0, evals=curve, seed=seed, algo="dppo")
    res = _run(
        f"""
        from openrlhf_dppo.cli.main import main
        rc = main(["compare", "--baseline", "grpo_s*", "dppo_s*", {str(DATA / "grpo")!r}, "--out", "rep"])
        assert rc == 0, rc
        from openrlhf_dppo.tiny.progress import print_summary
        print_summary(["grpo_s1", "dppo_s1"])
        print("loaded:", sorted({{m.split(".")[0] for m in sys.modules}} & set({BLOCKED!r})))
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert "loaded: []" in res.stdout
    assert "dppo_s* (2 seeds) vs grpo_s* (2 seeds)" in res.stdout  # the compare headline
    assert "== held-out accuracy (the comparison that counts) ==" in res.stdout  # the tiny summary
    assert {"report.md", "heldout.png", "reward.png"} <= {p.name for p in (tmp_path / "rep").iterdir()}


def test_the_writer_runs_without_torch(tmp_path):
    res = _run(
        """
        from types import SimpleNamespace
        from openrlhf_dppo.run_dir import RunDir, read_metrics
        run = RunDir("run", max_steps=1)
        run.write_config(SimpleNamespace(), SimpleNamespace(asdict=dict), "grpo", [], 0.0)
        run.log("train", 1, {"timing/step_total": 2.0})
        print([row["time/train_s"] for row in read_metrics("run")])
        """,
        tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "[2.0]"
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["hardware"]["gpus"] == [] and config["algo"] == "grpo"
