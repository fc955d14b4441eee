"""The report's outputs: PNG plots (valid images, expected axes), report.md, the terminal table, and the
`openrlhf-dppo compare` CLI through the console script's `main([...])`."""

from __future__ import annotations

import json

import matplotlib.image as mpimg
import pytest
from PIL import Image

from openrlhf_dppo.cli.main import main
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report.plots import AXES_KEY, build_figures, write_plots

# axes per figure, counted from the builders: held-out accuracy and reward, each vs training time +
# vs step (the DPPO fixture has one kind=eval line)
EXPECTED_AXES = {"heldout": 2, "reward": 2}


def _report(*dirs, **settings):
    return build_report([load_run(d) for d in dirs], Settings(**settings))


def test_figures_have_the_expected_axes(grpo_dir, dppo_dir):
    figures = build_figures(_report(grpo_dir, dppo_dir))
    assert {name: len(fig.axes) for name, fig in figures.items()} == EXPECTED_AXES
    # the reward plot carries both runs: a raw and a smoothed line per run on each axis
    by_time = figures["reward"].axes[0]
    assert sorted(
        line.get_label() for line in by_time.get_lines() if not line.get_label().startswith("_")
    ) == ["dppo", "grpo"]


def test_pngs_are_valid_images_holding_those_figures(grpo_dir, dppo_dir, tmp_path):
    paths = write_plots(_report(grpo_dir, dppo_dir), tmp_path / "out")
    assert set(paths) == set(EXPECTED_AXES)
    for name, path in paths.items():
        assert path.is_file() and path.suffix == ".png"
        pixels = mpimg.imread(path)  # decodes the whole image: a truncated file fails here
        assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
        with Image.open(path) as img:
            assert img.format == "PNG"
            assert img.size == (pixels.shape[1], pixels.shape[0])
            # the axes count is written into the PNG when the figure is saved
            assert int(img.text[AXES_KEY]) == EXPECTED_AXES[name], name


def test_runs_without_eval_lines_get_no_heldout_plot(tmp_path, rundirs):
    write_run, rows = rundirs.write_run, rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    a = write_run(tmp_path / "a", rows)
    b = write_run(tmp_path / "b", rows)
    figures = build_figures(_report(a, b))
    assert {n: len(f.axes) for n, f in figures.items()} == {"reward": 2}
    rep = _report(a, b)
    # identical runs: speedup 1, nothing pruned, ideal 1, efficiency 1
    c = rep.comparisons[0]
    assert (c.step_speedup, c.ideal_ratio, c.step_efficiency) == (1.0, 1.0, 1.0)


def test_cli_writes_report_and_prints_the_table(grpo_dir, dppo_dir, tmp_path, capsys):
    out = tmp_path / "report"
    rc = main(["compare", str(grpo_dir), str(dppo_dir), "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    # step speedup 2.00x, ideal 8/3 = 2.67x, 75% of ideal
    for text in ("2.00x", "2.67x", "75%", "report written to"):
        assert text in printed, text
    md = (out / "report.md").read_text()
    # the answer first; only the DPPO run has a held-out eval, one point: no smoothed value (window 3)
    assert (
        "- dppo (1 seed) vs grpo (1 seed): no smoothed held-out value in dppo and grpo: time to accuracy not "
        "measured; 2.00x step-time speedup (75% of the ideal 2.67x)\n" in md
    )
    assert "dppo has 1 eval point(s), fewer than --eval-window 3: it has no smoothed held-out value" in md
    assert "| dppo | 2.00x | 2.67x | 75% | 0.500 | 0.500 | 0.500 | 0.500 | — | yes |" in md
    assert "0.500 (cfg 0.5)" in md  # measured and configured prune rates side by side
    assert "after the first 1 warm-up step(s)" in md and "last 5 steps" in md
    # the final training reward, a trailing mean of 5 steps (the work table)
    assert "| 0.3000 | rollout/reward_mean |" in md and "| 0.4500 | rollout/reward_mean |" in md
    # eval table: per benchmark and average, both runs
    assert "| benchmark | grpo avg@k | grpo pass@k | dppo avg@k | dppo pass@k |" in md
    assert "| average | 0.3750 | 0.6250 | 0.4375 | 0.6250 |" in md
    assert "| math500 | 0.5000 | 0.7500 | 0.6250 | 0.7500 |" in md
    assert "| gsm8k | 0.2500 | 0.5000 | 0.2500 | — |" in md  # the DPPO file has no pass@k for gsm8k
    # the held-out curve per run: only the DPPO run has one point (math500 .25 at step 2, 10 s of training)
    assert "| dppo | 1 | 0.2500 (2) | — | — | — | 10.0 |" in md
    assert "no held-out eval in grpo" in md
    for name in EXPECTED_AXES:
        assert f"![{name}]({name}.png)" in md and (out / f"{name}.png").is_file()


def test_cli_baseline_and_target_flags(grpo_dir, dppo_dir, capsys):
    argv = ["compare", str(dppo_dir), str(grpo_dir), "--baseline", "grpo"]
    assert main([*argv, "--tables"]) == 0
    printed = capsys.readouterr().out
    # grpo first as baseline; --tables prints report.md's tables too
    assert "Step time vs the baseline grpo" in printed and "Work and training reward" in printed
    assert "dppo (1 seed) vs grpo (1 seed)" in printed


def test_cli_reports_a_run_in_progress(tmp_path, grpo_dir, capsys, rundirs):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES[:3], rundirs.GRPO_REWARD)
    live = rundirs.write_run(tmp_path / "live", rows, status="running", extra_lines=['{"kind": "train", "st'])
    assert main(["compare", str(grpo_dir), str(live)]) == 0
    printed = capsys.readouterr().out
    assert "in progress (step 3/5)" in printed
    assert "live is in progress (step 3/5): its numbers are partial" in printed
    assert "skipped a partial last line" in printed


@pytest.mark.parametrize("missing", ["metrics.jsonl", "run_config.json"])
def test_cli_names_the_missing_file(grpo_dir, dppo_dir, missing, capsys):
    (dppo_dir / missing).unlink()
    assert main(["compare", str(grpo_dir), str(dppo_dir)]) == 2
    err = capsys.readouterr().err
    assert f"missing {missing}" in err and str(dppo_dir) in err


def test_cli_missing_directory(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope")]) == 2
    assert f"run directory not found: {tmp_path / 'nope'}" in capsys.readouterr().err


def test_cli_same_directory_names_are_disambiguated(tmp_path, capsys, rundirs):
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    a = rundirs.write_run(tmp_path / "x" / "run", rows)
    b = rundirs.write_run(tmp_path / "y" / "run", rows)
    assert main(["compare", str(a), str(b)]) == 0
    printed = capsys.readouterr().out
    assert "x/run" in printed and "y/run" in printed


def test_report_md_lists_config_differences(grpo_dir, tmp_path, rundirs):
    cfg = json.loads((grpo_dir / "run_config.json").read_text())
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    args = cfg["args"]
    args["data"]["max_len"] = 512
    other = rundirs.write_run(tmp_path / "len512", rows, args=args)
    out = tmp_path / "rep"
    assert main(["compare", str(grpo_dir), str(other), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| data | `data.max_len` | 256 | 512 |" in md
    assert "len512 is not comparable with grpo: differs in data.max_len (data)" in md


def test_runs_differing_only_in_the_seed_are_one_arm(grpo_dir, tmp_path, rundirs, capsys):
    cfg = json.loads((grpo_dir / "run_config.json").read_text())
    rows = rundirs.train_rows(rundirs.GRPO_PHASES, rundirs.GRPO_REWARD)
    cfg["args"]["train"]["seed"] = 7
    other = rundirs.write_run(tmp_path / "grpo_7", rows, args=cfg["args"])
    rep = _report(grpo_dir, other)
    assert [(a.name, a.n, a.seeds) for a in rep.arms] == [("grpo*", 2, [42, 7])]
    assert rep.comparisons == [] and not any("comparable" in w for w in rep.warnings)
    # the same seed again is a repeat, not a seed: an arm of its own
    again = rundirs.write_run(tmp_path / "grpo_again", rows)
    rep = _report(grpo_dir, other, again)
    assert [(a.name, a.n) for a in rep.arms] == [("grpo*", 2), ("grpo_again", 1)]


def test_cli_rejects_bad_settings(grpo_dir, capsys):
    assert main(["compare", str(grpo_dir), "--warmup", "-1"]) == 2
    assert "--warmup must be >= 0, got -1" in capsys.readouterr().err
