"""benchmarks/gpu_smoke.sh in its CPU mode: what a CPU can run passes, with the import stand-ins the GPU
machine needs (ray, vllm) forced in; what needs CUDA says SKIP with its reason; a stage that fails fails
the run. The stand-ins are checked directly, and the carried wheel set against the repository's pins."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_smoke.sh"
STAGE = re.compile(r"^\[gpu_smoke\] stage (\w) (\w+)\s+(PASS|FAIL|TIMEOUT|SKIP)(?:\((.*)\))?  \[(\d+)s\]$")


def smoke(tmp: Path, **env) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the smoke with OUT under ``tmp``, no wheels and this interpreter -> (process, {id: line})."""
    (tmp / "no_wheels").mkdir(exist_ok=True)
    full = dict(
        os.environ, OUT=str(tmp / "out"), PYTHON=sys.executable, GPU_SMOKE_WHEELS=str(tmp / "no_wheels"),
        GPU_SMOKE_SITE=str(tmp / "site"), **env,
    )  # fmt: skip
    full.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=full, timeout=600, cwd=tmp
    )
    stages = {}
    for line in done.stdout.splitlines():
        m = STAGE.match(line)
        if m:
            stages[m[1]] = dict(name=m[2], status=m[3], reason=m[4] or "", seconds=int(m[5]))
    return done, stages


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpu_smoke_cpu")
    missing = tmp / "not_here" / "test_device_discipline.py"  # stage b is asked for a file that is absent
    done, stages = smoke(
        tmp, GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_STAND_INS="force", GPU_SMOKE_DISCIPLINE_TEST=str(missing)
    )
    return done, stages, tmp / "out", missing


def test_cpu_mode_passes_what_a_cpu_runs_and_skips_what_needs_cuda_or_is_missing(cpu_run):
    done, stages, _, missing = cpu_run
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(stages) == ["a", "b", "c", "d", "e"] + ["w"], done.stdout
    status = {k: v["status"] for k, v in stages.items()}
    assert status == {"a": "PASS", "w": "PASS", "b": "SKIP", "c": "PASS", "d": "PASS", "e": "SKIP"}, (
        done.stdout
    )
    assert stages["a"]["reason"].startswith("no CUDA device; torch ")
    assert stages["w"]["reason"].endswith("stand-ins: ray vllm")
    assert stages["b"]["reason"] == f"{missing} not found: no device-discipline tests to run"
    assert stages["c"]["reason"].startswith("packed == padded: max|dlogp| packed ")
    assert stages["d"]["reason"].startswith("grpo ok, dppo ok; init ")
    assert stages["e"]["reason"] == "needs CUDA: FusedAdam's CUDA kernel, JIT-built with nvcc"
    assert re.search(r"summary: a PASS, w PASS, b SKIP, c PASS, d PASS, e SKIP -> PASS in \d+s", done.stdout)


def test_the_outputs_are_what_the_device_tool_brings_back_and_agree_with_the_lines(cpu_run):
    done, stages, out, _ = cpu_run
    files = sorted(p.name for p in out.iterdir())
    assert files == ["actor.json", "gpu_actor.json", "probe.json", "smoke.log", "summary.json"]
    assert all(p.is_file() and re.fullmatch(r"[A-Za-z0-9._-]+", p.name) for p in out.iterdir())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "PASS" and summary["device"] == "cpu"
    assert [(s["id"], s["status"], s["reason"]) for s in summary["stages"]] == [
        (k, v["status"], v["reason"]) for k, v in stages.items()
    ]
    log = (out / "smoke.log").read_text()
    for stage in ("a probe", "w carry", "c packing", "d actor"):
        assert f"===== stage {stage} (timeout " in log, stage


def test_the_probe_records_the_image_and_the_smoke_environment_with_its_stand_ins(cpu_run):
    _, _, out, _ = cpu_run
    probe = json.loads((out / "probe.json").read_text())
    assert set(probe) == {"image", "smoke"}
    image, env = probe["image"], probe["smoke"]
    assert image["gpu"]["cuda_available"] is False and image["problems"] == []
    assert image["modules"]["ray"]["stand_in"] is False  # this machine's real Ray, before stage w
    assert env["modules"]["ray"]["stand_in"] is True and env["modules"]["vllm"]["stand_in"] is True
    assert env["modules"]["openrlhf"]["version"] == "0.11.2"
    assert env["host_imports"] and all(m["ok"] for m in env["host_imports"].values()), env["host_imports"]
    assert "openrlhf.trainer.ray.ppo_actor" in env["host_imports"]


def test_the_packing_and_actor_stages_wrote_their_checks(cpu_run):
    _, _, out, _ = cpu_run
    packing = json.loads((out / "gpu_actor.json").read_text())
    assert packing["config"]["size"] == "tiny" and packing["check"]["packed_ok"] is True
    actor = json.loads((out / "actor.json").read_text())
    assert actor["ok"] is True and actor["error"] is None and actor["env"]["device"] == "cpu"
    arms = actor["arms"]
    assert sorted(arms) == ["dppo", "grpo"]
    for arm in arms.values():
        assert arm["checks"] and all(arm["checks"].values()), arm["checks"]
        assert arm["devices"] == ["cpu"] and arm["optimizer_steps"] == 2
        # KL in the loss runs the weighted auxiliary loss; no entropy term (OpenRLHF compiles it per process)
        assert "kl" in arm["status"] and "entropy_loss" not in arm["status"], sorted(arm["status"])
    # the tiny shape: 8 prompts x 4; DPPO keeps half of them, each trained once
    assert arms["grpo"]["status"]["samples/trained"] == 32.0 == arms["grpo"]["rows"]
    assert arms["dppo"]["status"]["samples/trained"] == 16.0
    assert arms["dppo"]["status"]["tokens/trained"] < arms["grpo"]["status"]["tokens/trained"]


def test_in_cuda_mode_without_a_gpu_the_probe_fails_the_run_and_the_cuda_stages_skip(tmp_path):
    """The negative control: the same script, told to use CUDA on this CPU machine, must not pass."""
    done, stages = smoke(tmp_path, GPU_SMOKE_DEVICE="cuda", GPU_SMOKE_STAGES="a c d e")
    assert done.returncode == 1, done.stdout + done.stderr
    assert stages["a"]["status"] == "FAIL" and "torch sees no CUDA device" in done.stdout
    for sid in ("c", "d", "e"):
        assert stages[sid] == dict(
            name=stages[sid]["name"], status="SKIP", reason="torch sees no CUDA device (stage a)", seconds=0
        )
    assert stages["w"]["reason"] == stages["b"]["reason"] == "not selected"
    assert "-> FAIL in " in done.stdout


def _sleeper(tmp: Path) -> Path:
    """A stage-b test file that runs for 30 s: a stage its limit has to stop."""
    test = tmp / "sleeper" / "test_sleeps.py"
    test.parent.mkdir()
    test.write_text(
        "import time\n\n\ndef test_sleeps():\n    print('sleeping', flush=True)\n    time.sleep(30)\n"
    )
    return test


def test_a_stage_starts_only_with_its_whole_limit_left_else_it_is_skipped_not_failed(tmp_path):
    """Stage b's limit is 120 s: with 25 s of budget it does not start (it used to run with what was left,
    time out and FAIL the run)."""
    done, stages = smoke(
        tmp_path, GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_STAGES="b", GPU_SMOKE_BUDGET_S="25",
        GPU_SMOKE_DISCIPLINE_TEST=str(_sleeper(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    b = stages["b"]
    assert b["status"] == "SKIP" and b["seconds"] == 0, done.stdout
    assert re.fullmatch(r"time budget: needs 120s \+ 10s, 2[45]s of 25s left", b["reason"]), b["reason"]
    assert "-> PASS in " in done.stdout


def test_a_stage_stopped_at_its_limit_is_a_timeout_with_its_last_line_not_a_failure(tmp_path):
    done, stages = smoke(
        tmp_path, GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_STAGES="b", GPU_SMOKE_LIMITS="b=3",
        GPU_SMOKE_DISCIPLINE_TEST=str(_sleeper(tmp_path)),
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr  # 3: a timeout and no failure
    b = stages["b"]
    assert b["status"] == "TIMEOUT" and b["reason"].startswith("stopped at its 3s limit; last line: "), b
    assert 3 <= b["seconds"] <= 3 + 10 + 5  # the limit, SIGKILL 10 s later at most, and a little slack
    assert "-> TIMEOUT in " in done.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "TIMEOUT" and summary["stages"][2]["status"] == "TIMEOUT"


@pytest.mark.parametrize("limits", ["d=", "x=5", "d=0", "d=ten"])
def test_bad_stage_limits_are_refused_by_name(tmp_path, limits):
    done, _ = smoke(tmp_path, GPU_SMOKE_DEVICE="cpu", GPU_SMOKE_STAGES="none", GPU_SMOKE_LIMITS=limits)
    assert done.returncode == 2 and "GPU_SMOKE_LIMITS takes STAGE=SECONDS items" in done.stderr, done.stderr
    assert f"got '{limits}'" in done.stderr


STAND_IN_CHECK = """
import ray, vllm
from ray.util.placement_group import PlacementGroup
from vllm.inputs import TokensPrompt
class A: pass
assert ray.remote(A) is A and ray.remote(num_gpus=1)(A) is A
for module, name in ((ray, "get"), (vllm, "SamplingParams")):
    try:
        getattr(module, name)
    except AttributeError as err:
        assert "stand-in" in str(err) and name in str(err), err
    else:
        raise AssertionError(f"{module.__name__}.{name} exists in the stand-in")
print("stand-ins ok", ray.STAND_IN, vllm.STAND_IN)
"""


def test_the_stand_ins_answer_only_what_the_actor_path_imports_and_are_off_the_normal_path():
    stubs = ROOT / "benchmarks" / "gpu_smoke"
    env = dict(os.environ, PYTHONPATH=f"{stubs / 'ray_stub'}:{stubs / 'vllm_stub'}")
    done = subprocess.run([sys.executable, "-c", STAND_IN_CHECK], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert "stand-ins ok benchmarks/gpu_smoke/ray_stub benchmarks/gpu_smoke/vllm_stub" in done.stdout
    import ray  # the tests' own path: the real Ray, never the stand-in

    assert not hasattr(ray, "STAND_IN")


def test_the_carried_wheels_are_the_versions_the_cpu_environment_pins_one_version_each():
    from openrlhf_dppo._host import REQUIRED_OPENRLHF

    text = (ROOT / "benchmarks" / "gpu_smoke_wheels.sh").read_text()
    named = re.findall(r"\b([a-z][a-z0-9-]*)==([0-9][\w.]*)", text)
    carried = dict(named)
    assert len(carried) == len(set(named)) >= 10, named  # one version of each (two stop the install)
    cpu_pins = (ROOT / "requirements" / "openrlhf-cpu.txt").read_text()
    pins = dict(re.findall(r"^([a-z][a-z0-9-]*)==(\S+)$", cpu_pins, re.M))
    assert carried["openrlhf"] == REQUIRED_OPENRLHF
    assert carried["deepspeed"] == pins["deepspeed"] and carried["transformers"] == pins["transformers"]
