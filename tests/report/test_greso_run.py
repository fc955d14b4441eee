"""A GRESO run (``--dppo.method greso``) in the compare report: its ``algo`` is the method's name, its arm
is named after its runs and compared with the GRPO baseline as a peer (no equal-cost control is asked of
it), the dynamic filtering it needs does not break the comparison, and its rows render."""

from __future__ import annotations

import json

from openrlhf_dppo.cli.main import main
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report.render import markdown

GRESO_PHASES = [(5.0, 1.5, 1.0, 0.5)] + [(3.0, 1.5, 1.0, 0.5)] * 4
GRESO_REWARD = [0.0, 0.25, 0.25, 0.5, 0.5]


def greso_rows(rundirs) -> list[dict]:
    """GRPO's 32 samples trained a step; 12 prompts drawn, 2 skipped, 2 groups filtered (all solved)."""
    extra = {
        i: {
            "samples/generated": 40.0,
            "samples/trained": 32.0,
            "samples/pruned": 0.0,
            "samples/filtered": 8.0,
            "tokens/generated": 125.0,
            "tokens/trained": 100.0,
            "tokens/pruned": 0.0,
            "tokens/filtered": 25.0,
            "prompts/drawn": 12.0,
            "prompts/rolled_out": 10.0,
            "prompts/pruned": 2.0,
            "greso/p_easy": 0.5 - 0.01 * i,
            "greso/p_hard": 0.5 + 0.01 * i,
            "greso/easy_share": 0.2,
            "greso/hard_share": 0.0,
            "greso/adapted": float(i > 1),
        }
        for i in range(5)
    }
    return rundirs.train_rows(GRESO_PHASES, GRESO_REWARD, extra)


def write_greso(tmp_path, rundirs, name="greso_s1"):
    args = json.loads(json.dumps(rundirs.BASE_ARGS))
    args["dppo"] = {"method": "greso"}
    args["algo"] = {"dynamic_filtering_enable": True, "dynamic_filtering_range": [0.01, 0.99]}
    dppo = {"method": "greso", "prompt_prune_rate": 0.5, "completion_prune_rate": 0.0}
    return rundirs.write_run(tmp_path / name, greso_rows(rundirs), algo="greso", args=args, dppo=dppo)


def test_a_greso_run_is_its_own_arm_named_by_its_method(grpo_dir, tmp_path, rundirs):
    greso_dir = write_greso(tmp_path, rundirs)
    run = load_run(greso_dir)
    assert run.algo == "greso"
    report = build_report([load_run(grpo_dir), run], Settings())
    assert [a.name for a in report.arms] == ["grpo", "greso_s1"]
    assert [s.run.algo for s in report.arms[1].members] == ["greso"]
    md = markdown(report)
    assert "| greso_s1 | greso_s1 | greso |" in md  # the runs table: run, arm, algo
    assert "greso_s1 (1 seed) vs grpo (1 seed)" in md
    assert "greso_s1-uniform" not in md and "greso_s1-budget" not in md  # a peer, not DPPO
    # the work table shows GRESO's own rule, not --dppo.prompt_prune_rate, which it does not use
    row = next(line for line in md.splitlines() if line.startswith("| greso_s1 |") and "(cfg" in line)
    assert "(cfg GRESO's skip)" in row and "(cfg GRESO: none)" in row and "(cfg 0.5)" not in row


def test_compare_over_a_grpo_and_a_greso_run(grpo_dir, tmp_path, rundirs, capsys):
    greso_dir = write_greso(tmp_path, rundirs)
    out = tmp_path / "report"
    assert main(["compare", str(grpo_dir), str(greso_dir), "--out", str(out), "--baseline", "grpo"]) == 0
    printed = capsys.readouterr().out
    assert "greso_s1 (1 seed) vs grpo (1 seed)" in printed and "report written to" in printed
    assert "| greso_s1 | greso_s1 | greso |" in (out / "report.md").read_text()


def test_the_dynamic_filtering_greso_needs_does_not_break_its_comparison_with_grpo(rundirs):
    from openrlhf_dppo.report.comparability import NEEDED_BY_GRESO_CATEGORY, config_differences

    def config(algo, filtered):
        args = json.loads(json.dumps(rundirs.BASE_ARGS))
        if filtered:
            args["algo"] = {"dynamic_filtering_enable": True, "dynamic_filtering_range": [0.01, 0.99]}
        return {"algo": algo, "args": args}

    diffs = config_differences(config("grpo", False), config("greso", True))
    assert [(d.category, d.key) for d in diffs] == [
        (NEEDED_BY_GRESO_CATEGORY, "algo.dynamic_filtering_enable"),
        (NEEDED_BY_GRESO_CATEGORY, "algo.dynamic_filtering_range"),
    ]
    assert not any(d.breaks_comparison for d in diffs)
    # GRPO with dynamic filtering (the df arm) is another matter: the same flags break its comparison
    assert all(d.breaks_comparison for d in config_differences(config("grpo", False), config("grpo", True)))
