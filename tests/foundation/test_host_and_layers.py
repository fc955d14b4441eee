"""Version guard, the OpenRLHF modules we extend import on CPU, and core's one-way imports."""

import os
import subprocess
import sys
import textwrap

import pytest

from openrlhf_dppo._host import REQUIRED_OPENRLHF, OpenRLHFVersionError, check_openrlhf_version

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env
    )


def test_guard_accepts_the_pinned_version_only():
    assert check_openrlhf_version("0.11.2") == REQUIRED_OPENRLHF == "0.11.2"
    with pytest.raises(OpenRLHFVersionError, match=r"requires OpenRLHF 0\.11\.2, but OpenRLHF 0\.11\.1 is"):
        check_openrlhf_version("0.11.1")


def test_preparing_the_host_fails_clearly_with_another_installed_openrlhf(tmp_path):
    # A dist-info earlier on sys.path is what importlib.metadata reports as "the installed version".
    dist = tmp_path / "openrlhf-0.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.10.0\n")
    res = _run(
        "from openrlhf_dppo._host import prepare_host; prepare_host()",
        {"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])},
    )
    assert res.returncode != 0
    assert "OpenRLHFVersionError" in res.stderr
    assert "requires OpenRLHF 0.11.2, but OpenRLHF 0.10.0 is installed" in res.stderr


def test_import_succeeds_in_this_environment():
    res = _run("import openrlhf_dppo, openrlhf; print(openrlhf_dppo.__version__)")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "0.1.0"


HOST_MODULES = [
    "openrlhf.cli.train_ppo_ray",
    "openrlhf.trainer.ppo_trainer",
    "openrlhf.trainer.ray.ppo_actor",
    "openrlhf.trainer.ppo_utils.experience_maker",
    "openrlhf.trainer.ppo_utils.samples_generator",
    "openrlhf.trainer.ppo_utils.replay_buffer",
    "openrlhf.models.loss",
]


def test_every_openrlhf_module_we_extend_imports_on_this_machine():
    code = "import importlib, openrlhf_dppo._host as h; h.prepare_host()\n" + "".join(
        f"importlib.import_module({m!r})\n" for m in HOST_MODULES
    )
    res = _run(code + "print('ok')", {"DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")})
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok")


def test_core_imports_torch_only():
    res = _run(
        """
        import sys
        import openrlhf_dppo.core
        heavy = sorted({m.split('.')[0] for m in sys.modules} & {
            'ray', 'deepspeed', 'vllm', 'openrlhf', 'transformers', 'flash_attn'})
        print(','.join(heavy))
        """
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "", f"openrlhf_dppo.core pulled in: {res.stdout.strip()}"
    assert "torch" in _run("import sys, openrlhf_dppo.core; print(list(sys.modules))").stdout


def test_importing_the_package_core_and_report_changes_nothing_and_needs_no_host():
    # sys.path, PYTHONPATH and the loaded modules are the same before and after the imports, and no
    # host module (nor the flash-attn stand-in) is loaded.
    res = _run(
        """
        import os, sys
        path, pp = list(sys.path), os.environ.get("PYTHONPATH")
        import openrlhf_dppo, openrlhf_dppo.core, openrlhf_dppo.report
        assert sys.path == path, "sys.path changed"
        assert os.environ.get("PYTHONPATH") == pp, "PYTHONPATH changed"
        heavy = sorted({m.split('.')[0] for m in sys.modules} & {
            'ray', 'deepspeed', 'vllm', 'openrlhf', 'flash_attn'})
        print(','.join(heavy))
        """
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "", f"imports pulled in: {res.stdout.strip()}"


def test_the_version_guard_runs_where_the_host_is_used(tmp_path):
    dist = tmp_path / "openrlhf-0.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: openrlhf\nVersion: 0.10.0\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO])}
    assert _run("import openrlhf_dppo", env).returncode == 0
    res = _run("import openrlhf_dppo.adapters", env)
    assert res.returncode != 0
    assert "requires OpenRLHF 0.11.2, but OpenRLHF 0.10.0 is installed" in res.stderr
