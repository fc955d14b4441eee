"""What a reader of the README relies on: its first screen shows the command the project is about, the
CPU demo and the test command, and an honest status; every command it gives exists; its results table is
the "Current results" table of benchmarks/RESULTS.md, whose rows link the sections behind them; the flags
DPPO refuses are the ones it lists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
RESULTS = (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")


def _words(text: str) -> int:
    """Words as `wc -w` counts them (a table's pipes included: they fill the reader's screen too)."""
    return len(text.split())


def _table_rows(text: str) -> list[list[str]]:
    """The cells of a markdown table's body rows (the header and the |---| line left out)."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    assert len(rows) > 2 and set(lines[1]) <= set("|-"), text
    return rows[2:]


def _table_header(text: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith("|"))
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _current_results() -> str:
    """RESULTS' "Current results" section: from its heading to the next line that is not part of it."""
    m = re.search(
        r"^## Current results \((\d{4}-\d{2}-\d{2})\)\n(.*?)(?=^#|^Note on|\Z)", RESULTS, re.M | re.S
    )
    assert m, 'benchmarks/RESULTS.md has no "## Current results (YYYY-MM-DD)" section'
    return m.group(0)


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_first_screen_shows_the_recipe_the_demo_the_tests_and_the_status():
    assert _words(README) <= 1500, f"README.md has {_words(README)} words (at most 1,500)"
    first_screen = "\n".join(README.splitlines()[:60])
    for command in ("bash examples/scripts/train_dppo_qwen3.sh", "make demo", "make test"):
        assert re.search(rf"^{re.escape(command)}\b", first_screen, re.M), command
    assert "https://arxiv.org/abs/2603.04135" in first_screen and "docs/METHOD.md" in first_screen
    assert "No GPU run exists yet" in first_screen and "2.37x" in first_screen


def test_every_command_of_the_readme_exists():
    """Each ``bash FILE``, ``python -m openrlhf_dppo...``, ``openrlhf-dppo SUBCOMMAND`` and ``make TARGET``
    in the README's code blocks names a script, a module, a subcommand or a Makefile target that exists."""
    blocks = "\n".join(re.findall(r"```(?:bash|diff)?\n(.*?)```", README, re.S))
    scripts = re.findall(r"\bbash ([\w./-]+\.(?:sh|sbatch))", blocks)
    scripts += re.findall(r"\bsbatch .*?([\w./-]+\.sbatch)", blocks, re.S)
    modules = re.findall(r"python -m (openrlhf_dppo[\w.]*)", blocks)
    subcommands = re.findall(r"^openrlhf-dppo (\w+)", blocks, re.M)
    targets = re.findall(r"^make ([\w-]+)", blocks, re.M)
    assert scripts and modules and targets and subcommands
    assert all((ROOT / s).is_file() for s in scripts), scripts
    for module in modules:
        path = ROOT / module.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module
    dispatcher = (ROOT / "openrlhf_dppo" / "cli" / "main.py").read_text()
    assert all(f'"{s}": (' in dispatcher for s in subcommands), subcommands
    makefile = (ROOT / "Makefile").read_text()
    assert all(re.search(rf"^{t}:", makefile, re.M) for t in targets), targets


def test_the_readme_names_the_demo_and_the_test_command_ci_runs():
    assert "make demo" in README and "make test" in README and ".ci/run" in README
    assert re.search(r"^make test$", (ROOT / ".ci" / "run").read_text(), re.M)
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    assert {"demo", "test", "setup-gpu", "test-unit", "test-e2e"} <= targets


def test_results_opens_with_a_dated_current_results_section_and_reads_in_five_minutes():
    section = _current_results()
    assert RESULTS.index(section) == RESULTS.index("\n## ") + 1, "Current results is not the first section"
    assert _words(RESULTS) <= 6000, f"benchmarks/RESULTS.md has {_words(RESULTS)} words (at most 6,000)"


def test_every_current_result_links_a_section_of_results_that_exists():
    anchors = {_slug(h) for h in re.findall(r"^#+ (.+)$", RESULTS, re.M)}
    for row in _table_rows(_current_results()):
        links = re.findall(r"\]\(#([^)]+)\)", row[-1])
        assert links and all(a in anchors for a in links), row


def test_the_readme_table_is_the_current_results_table():
    block = re.search(r"<!-- current-results -->\n(.*?)<!-- /current-results -->", README, re.S)
    assert block, "README.md has no <!-- current-results --> table"
    results = _table_rows(_current_results())
    assert [row[:-1] for row in results] == _table_rows(block.group(1))  # all but the section links
    assert "benchmarks/RESULTS.md#" + _slug(_current_results().splitlines()[0].lstrip("# ")) in README


def test_the_table_check_fails_on_a_changed_figure():
    block = re.search(r"<!-- current-results -->\n(.*?)<!-- /current-results -->", README, re.S).group(1)
    results = [row[:-1] for row in _table_rows(_current_results())]
    assert results != _table_rows(block.replace("0.56x", "0.50x", 1))


CONTROL = "vs the same budget, chosen at random"  # the equal-cost control's column (report.controls)


def test_every_current_result_says_how_it_fares_against_the_equal_cost_control():
    for text in (
        _current_results(),
        re.search(r"<!-- current-results -->\n(.*?)<!--", README, re.S).group(1),
    ):
        header = _table_header(text)
        assert CONTROL in header, header
        for row in _table_rows(text):
            cell = row[header.index(CONTROL)]
            # a ratio over the control's time, a control that did not reach the target, or no control run
            assert re.fullmatch(r"\d+\.\d+x.*|control not reached.*|not run", cell), row


def _section(heading: str, text: str = README) -> str:
    """A ``## heading`` section of the README, up to the next ``## ``."""
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"no section ## {heading}"
    return m.group(1)


def _refused_flags() -> set[str]:
    """The OpenRLHF flags DPPO refuses by name (``FlagError``s of ``validate`` and
    ``check_dppo_requirements`` in cli/validate.py, read from the source)."""
    import ast

    tree = ast.parse((ROOT / "openrlhf_dppo" / "cli" / "validate.py").read_text(encoding="utf-8"))
    out = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        if fn.name not in ("validate", "check_dppo_requirements"):
            continue
        for call in ast.walk(fn):
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "FlagError":
                flag = call.args[0]
                if isinstance(flag, ast.Constant) and not flag.value.startswith("--dppo."):
                    out.add(flag.value)
    return out


def test_the_readmes_refusal_list_names_every_flag_dppo_refuses():
    section = _section("Swap your GRPO command")
    refusals = section.split("DPPO refuses to start", 1)[1].split("\n\n", 1)[0]
    flags = _refused_flags()
    assert {"--vllm.num_engines", "--rollout.vllm_generate_batch_size"} <= flags
    assert "--train.async_enable" not in flags  # both arms run the async trainer
    missing = sorted(f for f in flags if f"`{f}" not in refusals)
    assert not missing, f"README's list of refusals does not name {missing}"


def test_the_status_says_which_sitting_ended_below_grpo():
    status = " ".join(_section("Status").split())
    block = re.search(r"<!-- current-results -->\n(.*?)<!-- /current-results -->", README, re.S).group(1)
    final = _table_header(block).index("final vs GRPO")
    below = [row for row in _table_rows(block) if row[final].endswith("below")]
    assert below, "the check needs a row that ended below GRPO (update it when none does)"
    for row in below:
        figures = row[final].split(",")[0]  # "0.640 vs 0.654"
        assert figures in status and "below GRPO" in status, row
    assert "level with GRPO on both" not in status


def test_the_check_flag_is_described_as_the_script_does(tmp_path):
    import os
    import subprocess
    import sys

    quickstart = (ROOT / "docs" / "GPU_QUICKSTART.md").read_text(encoding="utf-8")
    for name, text in (("README.md", README), ("docs/GPU_QUICKSTART.md", quickstart)):
        said = " ".join(text.split())
        if "--check" not in said:
            continue
        assert "`--check` checks the build toolchain" in said, name
        assert "once torch is installed (step 1)" in said and "before it builds flash-attn" in said, name
    # the script: without torch, --check stops and names step 1 ...
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = dict(os.environ, PYTHON=sys.executable, PYTHONPATH=str(tmp_path))
    script = ROOT / "scripts" / "setup_gpu.sh"
    proc = subprocess.run(
        ["bash", str(script), "--check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0 and "step 1 installs it" in proc.stdout + proc.stderr
    # ... and the install runs the same check after step 4, right before it builds flash-attn
    lines = [line.strip() for line in script.read_text().splitlines()]
    flash = lines.index("pip_install --no-build-isolation flash-attn")
    step4 = next(i for i, line in enumerate(lines) if line.startswith('echo "[setup-gpu] 4/6'))
    assert "check_toolchain" in lines[step4:flash]


def test_compare_is_introduced_with_the_eval_flag_its_accuracy_needs():
    section = " ".join(_section("Reading the comparison report").split())
    assert "`--eval.dataset`" in section
    quoted = re.search(r'compare warns "([^"]+)"', section).group(1)
    checks = (ROOT / "openrlhf_dppo" / "report" / "checks.py").read_text(encoding="utf-8")
    assert f'"{quoted} in "' in checks  # the warning compare prints for a run without evaluations
