"""Each --dppo flag is written once, on its field: --help and the table of docs/FLAGS.md follow."""

import dataclasses
import importlib.util
import re
import subprocess
import sys

import pytest
from cli_commands import ROOT, full_parser

from openrlhf_dppo.cli import flags
from openrlhf_dppo.cli import train_dppo_ray as cli
from openrlhf_dppo.core import METHODS, PROMPT_POLICIES, DPPOConfig

FLAGS_TABLE = ROOT / "scripts" / "flags_table.py"  # the generator, outside the installed package
_spec = importlib.util.spec_from_file_location("flags_table", FLAGS_TABLE)
flags_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flags_table)


def _squeezed(text: str) -> str:
    """Without whitespace: argparse re-wraps help text (also after a hyphen)."""
    return "".join(text.split())


def test_the_flags_are_the_fields_of_the_config_and_the_run_options():
    names = [s.name for s in flags.flag_specs()]
    assert names == [f.name for f in dataclasses.fields(DPPOConfig)] + [
        "run_dir",
        "max_steps",
        "schedule_steps",
    ]
    assert len(names) == 12
    specs = {s.name: s for s in flags.flag_specs()}
    assert specs["prompt_policy"].choices == PROMPT_POLICIES.names() == ["proportional", "uniform"]
    assert specs["prompt_rate_control"].choices == ["fixed", "zero-share"]
    assert specs["method"].choices == list(METHODS) and specs["max_steps"].parse("3") == 3
    assert specs["run_dir"].shown_default == "--ckpt.output_dir" and specs["method"].shown_default == "dppo"


def test_a_flag_field_without_help_is_refused(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Bare:
        knob: int = 3

    monkeypatch.setattr(flags, "FLAG_SOURCES", (DPPOConfig, Bare))
    with pytest.raises(RuntimeError, match="Bare.knob has no help"):
        flags.flag_specs()


def test_help_shows_every_flag_with_its_field_help_default_and_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"], train_fn=lambda a: None)
    assert exc.value.code == 0
    out = _squeezed(capsys.readouterr().out)
    assert "--actor.model_name_or_path" in out  # OpenRLHF's own flags are there too
    for spec in flags.flag_specs():
        assert _squeezed(f"{spec.help} (default: {spec.shown_default})") in out, spec.name
        if spec.choices:
            assert _squeezed(f"{spec.flag} {{{','.join(spec.choices)}}}") in out, spec.name


def test_the_flags_md_table_is_the_generated_table():
    text = (ROOT / flags_table.TARGET).read_text()
    assert text.count(flags_table.BEGIN) == 1
    assert flags_table.section(text) == flags_table.markdown_table(), (
        "docs/FLAGS.md's --dppo table is stale: run python scripts/flags_table.py --write"
    )
    for spec in flags.flag_specs():
        assert f"| `{spec.flag}` |" in text


def test_the_table_generator_rewrites_only_the_marked_section(tmp_path):
    doc = tmp_path / "docs" / "FLAGS.md"
    doc.parent.mkdir()
    for argv in (["--write", str(doc)], ["--write"]):  # a named file, and the default docs/FLAGS.md
        doc.write_text(f"# x\nbefore\n{flags_table.BEGIN}\n| old |\n{flags_table.END}\nafter\n")
        out = subprocess.run(
            [sys.executable, str(FLAGS_TABLE), *argv],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        text = doc.read_text()
        assert text.startswith("# x\nbefore\n") and text.endswith(f"{flags_table.END}\nafter\n")
        assert flags_table.section(text) == flags_table.markdown_table() and "| old |" not in text
    with pytest.raises(ValueError, match="markers are missing"):
        flags_table.section("no markers here")


def test_flags_md_names_only_flags_that_exist_and_the_readme_links_the_table_without_a_copy():
    text = (ROOT / "docs" / "FLAGS.md").read_text()
    # the removed flags are named in one paragraph, which says what each is fixed at now
    named_text = re.sub(r"\nRemoved, each fixed at .*?\n\n", "\n", text, flags=re.S)
    assert named_text != text, "docs/FLAGS.md lost its paragraph of removed flags"
    known = set(full_parser()._option_string_actions)
    # `--a.b_*` and `--a.b.*` name a family
    named = set(re.findall(r"(?<![\w-])--[a-z]\w*(?:\.\w+)+(?:\.?\*)?", named_text))

    def exists(flag: str) -> bool:
        return any(k.startswith(flag[:-1]) for k in known) if flag.endswith("*") else flag in known

    unknown = sorted(f for f in named if not exists(f))
    assert named and not unknown, f"docs/FLAGS.md names flags that do not exist: {unknown}"
    outside = text.replace(flags_table.section(text), "")
    assert "| `--dppo." not in outside  # the generated table is the only flag table there
    readme = (ROOT / "README.md").read_text()
    assert flags_table.BEGIN not in readme
    assert not [line for line in readme.splitlines() if line.startswith("| `--dppo.")]  # no flag-table row
    assert "docs/FLAGS.md#the-dppo-flags" in readme
