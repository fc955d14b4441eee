"""The `openrlhf-dppo` console script: a dispatcher that imports each subcommand lazily."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from openrlhf_dppo.cli import main as cli_main


def _fake_module(monkeypatch, name, entry):
    module = types.ModuleType(name)
    if entry is not None:
        module.main = entry
    monkeypatch.setitem(sys.modules, name, module)


def test_usage_and_unknown_subcommand(capsys):
    assert cli_main.main([]) == 2
    assert "usage: openrlhf-dppo {train,eval,compare,advise}" in capsys.readouterr().out
    assert cli_main.main(["--help"]) == 0
    assert cli_main.main(["trian"]) == 2
    assert "unknown subcommand 'trian'" in capsys.readouterr().err


def test_importing_the_dispatcher_and_compare_stays_light():
    """train pulls in Ray/DeepSpeed/vLLM: the dispatcher must not import it, nor compare torch."""
    code = (
        "import sys, openrlhf_dppo.cli.main, openrlhf_dppo.cli.compare\n"
        "print(sorted(m for m in ('openrlhf_dppo.cli.train_dppo_ray', 'openrlhf_dppo.cli.eval', "
        "'torch', 'ray', 'openrlhf', 'matplotlib', 'rich') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("command", ["train", "eval"])
def test_subcommand_main_taking_argv_gets_the_rest(monkeypatch, command):
    seen = []
    _fake_module(monkeypatch, cli_main.SUBCOMMANDS[command][0], lambda argv: seen.append(argv) or 3)
    monkeypatch.setattr(sys, "argv", ["openrlhf-dppo"])
    assert cli_main.main([command, "--a", "1"]) == 3
    assert seen == [["--a", "1"]]


def test_compare_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main.main(["compare", "--help"])
    assert exc.value.code == 0
    assert "--eval-window" in capsys.readouterr().out
