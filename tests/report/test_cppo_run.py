"""A CPPO run (``--dppo.method cppo``) in the compare report: its ``algo`` is the method's name, its arm
is named after its runs and compared with the GRPO baseline as a peer, not as DPPO (no equal-cost
control is asked of it), and its rows render."""

from __future__ import annotations

import json

from openrlhf_dppo.cli.main import main
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.report.render import markdown

CPPO_PHASES = [(5.0, 1.5, 1.0, 0.5)] + [(2.5, 0.75, 0.5, 0.25)] * 4  # totals: 8, then 4 a step
CPPO_REWARD = [0.0, 0.25, 0.25, 0.5, 0.5]


def cppo_rows(rundirs) -> list[dict]:
    """Twice GRPO's 32 samples drawn a step (int(B / (1 - 0.5)) prompts), half pruned, weights 1."""
    extra = {
        i: {
            "samples/generated": 64.0,
            "samples/trained": 32.0,
            "samples/pruned": 32.0,
            "tokens/generated": 200.0,
            "tokens/trained": 100.0,
            "tokens/pruned": 100.0,
            "prompts/drawn": 16.0,
            "prompts/rolled_out": 16.0,
            "prompts/pruned": 0.0,
            "dppo/prompt_keep_frac": 1.0,
            "dppo/completion_keep_frac": 0.5,
            "dppo/weight_mean": 1.0,
            "dppo/weight_max": 1.0,
            "dppo/weight_ess": 32.0,
            "dppo/pack_density": 0.9,
            "dppo/pack_micro_batches": 2.0,
            "dppo/pack_lower_bound": 2.0,
            "dppo/pack_rank_imbalance": 1.0,
        }
        for i in range(5)
    }
    return rundirs.train_rows(CPPO_PHASES, CPPO_REWARD, extra)


def write_cppo(tmp_path, rundirs, name="cppo_s1"):
    args = json.loads(json.dumps(rundirs.BASE_ARGS))
    args["dppo"] = {"method": "cppo", "completion_prune_rate": 0.5}
    dppo = {"method": "cppo", "prompt_prune_rate": 0.5, "completion_prune_rate": 0.5}
    return rundirs.write_run(tmp_path / name, cppo_rows(rundirs), algo="cppo", args=args, dppo=dppo)


def test_a_cppo_run_is_its_own_arm_named_by_its_method(grpo_dir, tmp_path, rundirs):
    cppo_dir = write_cppo(tmp_path, rundirs)
    run = load_run(cppo_dir)
    assert run.algo == "cppo"
    report = build_report([load_run(grpo_dir), run], Settings())
    assert [a.name for a in report.arms] == ["grpo", "cppo_s1"]
    cppo_arm = report.arms[1]
    assert [s.run.algo for s in cppo_arm.members] == ["cppo"]
    md = markdown(report)
    assert "| cppo_s1 | cppo_s1 | cppo |" in md  # the runs table: run, arm, algo
    assert "cppo_s1 (1 seed) vs grpo (1 seed)" in md
    # a peer, not DPPO: no "X-uniform / X-budget" control is asked of it
    assert "cppo_s1-uniform" not in md and "cppo_s1-budget" not in md
    row = next(line for line in md.splitlines() if line.startswith("| cppo_s1 |") and "(cfg" in line)
    assert "(cfg CPPO: none)" in row and "(cfg 0.5)" in row  # no prompt pruned; P of each group


def test_compare_over_a_grpo_and_a_cppo_run(grpo_dir, tmp_path, rundirs, capsys):
    cppo_dir = write_cppo(tmp_path, rundirs)
    out = tmp_path / "report"
    assert main(["compare", str(grpo_dir), str(cppo_dir), "--out", str(out), "--baseline", "grpo"]) == 0
    printed = capsys.readouterr().out
    assert "cppo_s1 (1 seed) vs grpo (1 seed)" in printed and "report written to" in printed
    assert "| cppo_s1 | cppo_s1 | cppo |" in (out / "report.md").read_text()


def test_the_packing_args_cppo_runs_with_do_not_break_its_comparison_with_grpo(rundirs):
    from openrlhf_dppo.report.comparability import SET_BY_DPPO_CATEGORY, config_differences

    def config(algo, packed):
        args = json.loads(json.dumps(rundirs.BASE_ARGS))
        args.setdefault("train", {})["dynamic_batch_enable"] = packed
        return {"algo": algo, "args": args}

    diffs = config_differences(config("grpo", False), config("cppo", True))
    assert [(d.category, d.key) for d in diffs] == [(SET_BY_DPPO_CATEGORY, "train.dynamic_batch_enable")]
    assert not any(d.breaks_comparison for d in diffs)
