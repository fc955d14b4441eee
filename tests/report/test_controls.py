"""compare's equal-cost control (report.controls): the control arms are told from run_config.json, each
DPPO arm is matched to its own, and the column "vs the same budget, chosen at random" is its time to the
baseline's final accuracy over the control's, or says that no control ran.

Every arm below has the held-out curve .25 .25 .375 .5 .5 at steps 0, 2, 4, 6, 8 (curve_run's
eval_every 2): smoothed over 3 points it is - .25 .375 .5 .5, so the target (GRPO's final) is .5 and
every arm reaches it at step 6, at 6 x its step time of training. The arms differ in their step times
only, so each ratio is a ratio of step times.
"""

from __future__ import annotations

import json

import pytest

from openrlhf_dppo.report import Settings
from openrlhf_dppo.report import controls as C
from openrlhf_dppo.report.arms import build_report
from openrlhf_dppo.report.headline import headline
from openrlhf_dppo.report.render import markdown
from openrlhf_dppo.report.run import load_run
from openrlhf_dppo.report.tables import heldout_table, speedup_table, summary_table

CURVE = [0.25, 0.25, 0.375, 0.5, 0.5]
NEVER = [0.25, 0.25, 0.25, 0.25, 0.25]  # never at .5


def edit(path, *, batch=None, policy=None, dppo=None, rolled_out=None, args=None):
    """Rewrites a curve_run's run_config.json (rollout.batch_size, --dppo.prompt_policy and other DPPO
    flags, in both places a real run records them, other args as {"group.flag": value}) and adds
    prompts/rolled_out to its training lines."""
    cfg_path = path / "run_config.json"
    cfg = json.loads(cfg_path.read_text())
    if batch is not None:
        cfg["args"]["rollout"]["batch_size"] = batch
    for dotted, value in (args or {}).items():
        group, flag = dotted.split(".")
        cfg["args"].setdefault(group, {})[flag] = value
    for key, value in (({"prompt_policy": policy} if policy else {}) | (dppo or {})).items():
        cfg["dppo"][key] = cfg["args"]["dppo"][key] = value
    cfg_path.write_text(json.dumps(cfg))
    if rolled_out is not None:
        lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
        train = [row for row in lines if row["kind"] == "train"]
        for i, row in enumerate(train):
            row["prompts/rolled_out"] = rolled_out[i % len(rolled_out)]
        (path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def sitting(tmp_path, rundirs, arms):
    """arms: [(name, step_time, evals, algo, edits)] -> the report with grpo the baseline."""
    runs, names = [], {}
    for name, step_time, evals, algo, edits in arms:
        path = rundirs.curve_run(tmp_path / name, step_time=step_time, evals=evals, algo=algo)
        runs.append(load_run(edit(path, **edits)))
        names[name] = name
    return build_report(runs, Settings(), baseline="grpo", arms=names)


def cells(rep):
    title, headers, rows = heldout_table(rep)
    return {row[0]: row[headers.index(C.COLUMN)] for row in rows}


GRPO = ("grpo", 4.0, CURVE, "grpo", {"batch": 8})
DPPO = ("dppo", 1.0, CURVE, "dppo", {"rolled_out": [4, 4, 5, 3]})  # 4 prompts a step of 8
UNIFORM = ("dppo-uniform", 2.0, CURVE, "dppo", {"policy": "uniform", "rolled_out": [4]})
BUDGET = ("dppo-budget", 3.0, CURVE, "grpo", {"batch": 4})


def test_each_dppo_arm_is_held_against_both_controls_of_its_cost(tmp_path, rundirs):
    rep = sitting(tmp_path, rundirs, [GRPO, DPPO, UNIFORM, BUDGET])
    assert rep.target == 0.5 and [a.ttt for a in rep.arms] == [24.0, 6.0, 12.0, 18.0]
    assert cells(rep) == {
        "grpo": "baseline",
        "dppo": "0.50x uniform selection; 0.33x GRPO at DPPO's budget",  # 6 / 12, 6 / 18
        "dppo-uniform": "control: uniform selection",
        "dppo-budget": "control: GRPO at DPPO's budget",
    }
    title, headers, rows = summary_table(rep)  # the console's narrow column
    assert rows[1][headers.index("vs control")] == "0.50x uniform; 0.33x GRPO budget"
    assert rows[3][headers.index("vs control")] == "control: GRPO budget" and C.COLUMN in title
    dppo_line = headline(rep)[0]
    assert "matched-accuracy ratio 0.25" in dppo_line  # 6 / 24: against GRPO as before
    assert f"; {C.COLUMN}: 0.50x uniform selection; 0.33x GRPO at DPPO's budget;" in dppo_line
    assert f"{C.COLUMN}: control: uniform selection;" in headline(rep)[1]
    assert C.COLUMN not in headline(rep)[2]  # a GRPO arm: nothing to hold it against
    assert "| 0.25 | no spread (1 seed each) | 0.50x uniform selection; 0.33x GRPO at DPPO's budget |" in (
        markdown(rep)
    )


def test_without_a_control_run_the_column_says_so(tmp_path, rundirs):
    rep = sitting(tmp_path, rundirs, [GRPO, DPPO])
    assert cells(rep)["dppo"] == "no control run"
    title, headers, rows = summary_table(rep)
    assert rows[1][headers.index("vs control")] == "no control run"
    assert f"{C.COLUMN}: no control run;" in headline(rep)[0]


def test_a_control_that_never_reaches_the_target_is_said_so_not_given_a_ratio(tmp_path, rundirs):
    slow_budget = ("dppo-budget", 3.0, NEVER, "grpo", {"batch": 4})
    rep = sitting(tmp_path, rundirs, [GRPO, DPPO, slow_budget])
    assert cells(rep)["dppo"] == "GRPO at DPPO's budget did not reach the target"
    never_dppo = ("dppo", 1.0, NEVER, "dppo", {"rolled_out": [4]})
    rep = sitting(tmp_path / "b", rundirs, [GRPO, never_dppo, UNIFORM])
    assert cells(rep)["dppo"] == "not reached (uniform selection: 12.0 s)"


def test_a_dppo_arm_is_matched_to_the_control_that_differs_in_the_selection_alone_and_spends_its_budget(
    tmp_path, rundirs
):
    # two uniform arms: one draws B and rolls out the kept prompts as DPPO does, the other refills;
    # two GRPO arms of smaller batches: 2 prompts (a half of DPPO's 4.0, beyond 10%) and 4
    arms = [GRPO, DPPO]
    arms.append(
        ("uniform-refill", 0.5, CURVE, "dppo", {"policy": "uniform", "dppo": {"prompt_batch": "refill"}})
    )
    arms.append(("grpo-quarter", 0.25, CURVE, "grpo", {"batch": 2}))
    arms += [UNIFORM, BUDGET]
    rep = sitting(tmp_path, rundirs, arms)
    assert cells(rep)["dppo"] == "0.50x uniform selection; 0.33x GRPO at DPPO's budget"
    assert cells(rep)["grpo-quarter"] == "control: GRPO at DPPO's budget"  # a control, not DPPO's
    # an arm that rolls out the whole batch (refill) has no GRPO control of its cost here
    refill = ("dppo", 1.0, CURVE, "dppo", {"rolled_out": [8], "dppo": {"prompt_batch": "refill"}})
    rep = sitting(tmp_path / "b", rundirs, [GRPO, refill, BUDGET, UNIFORM])
    assert cells(rep)["dppo"] == "no control run"
    rep = sitting(tmp_path / "c", rundirs, [GRPO, refill, arms[2]])  # its uniform twin refills too
    assert cells(rep)["dppo"] == "2.00x uniform selection"  # 6 / 3


def test_of_two_budget_controls_the_nearest_to_the_rolled_out_prompts_is_the_match(tmp_path, rundirs):
    grpo = ("grpo", 4.0, CURVE, "grpo", {"batch": 64})
    b30, b32 = ("grpo-30", 5.0, CURVE, "grpo", {"batch": 30}), ("grpo-32", 3.0, CURVE, "grpo", {"batch": 32})
    dppo = ("dppo", 1.0, CURVE, "dppo", {"rolled_out": [31, 32]})  # 31.5: both within 10%, 32 nearer
    rep = sitting(tmp_path, rundirs, [grpo, dppo, b30, b32])
    assert cells(rep)["dppo"] == "0.33x GRPO at DPPO's budget"  # 6 / 18, not 6 / 30
    tie = ("dppo", 1.0, CURVE, "dppo", {"rolled_out": [31]})  # 31: as near to 30 as to 32
    rep = sitting(tmp_path / "tie", rundirs, [grpo, tie, b30, b32])
    assert cells(rep)["dppo"] == "0.20x GRPO at DPPO's budget"  # the first listed: 6 / 30


def test_a_smaller_grpo_batch_is_a_control_only_beside_a_grpo_baseline(tmp_path, rundirs):
    rep = sitting(tmp_path, rundirs, [GRPO, DPPO, BUDGET])
    budget = rep.arms[2]
    assert C.kind(budget, rep.baseline) == C.BUDGET
    assert C.kind(rep.arms[1], rep.baseline) is None and C.kind(rep.baseline, rep.baseline) is None
    # the same GRPO arm beside a DPPO baseline, or with dynamic filtering, is no control
    assert C.kind(budget, rep.arms[1]) is None
    filtered = sitting(tmp_path / "df", rundirs, [GRPO, DPPO, ("df", 3.0, CURVE, "grpo", {"batch": 4})])
    cfg = filtered.arms[2].members[0].run.config
    cfg["args"]["algo"] = {"dynamic_filtering_enable": True}
    assert C.kind(filtered.arms[2], filtered.baseline) is None


def test_the_budget_of_a_run_is_its_mean_rolled_out_prompts_per_step_rounded_half_up(
    tmp_path, rundirs, capsys
):
    cases = (([4, 4, 5, 3], 4), ([4, 5], 5), ([4, 4, 4, 5], 4), ([0.2], 1))  # 4.0, 4.5, 4.25, 0.2
    for i, (rolled_out, expected) in enumerate(cases):
        path = rundirs.curve_run(tmp_path / f"d{i}", step_time=1.0, evals=CURVE, algo="dppo")
        edit(path, rolled_out=rolled_out)
        assert C.budget_batch_size(load_run(path)) == expected
    assert C.main(["--budget", str(path)]) == 0 and capsys.readouterr().out == "1\n"
    grpo = rundirs.curve_run(tmp_path / "grpo", step_time=1.0, evals=CURVE)
    with pytest.raises(ValueError, match="no training step logs prompts/rolled_out"):
        C.budget_batch_size(load_run(grpo))
    assert C.main(["--budget", str(grpo)]) == 2 and "prompts/rolled_out" in capsys.readouterr().err
    assert C.main(["--budget", str(tmp_path / "absent")]) == 2


# train_tiny_cpu.sh's flags that follow from PROMPTS (rollout.batch_size): --train.batch_size PROMPTS x
# SAMPLES (4 here) and --train.num_episodes ceil(4 x steps x PROMPTS / pool) (150 steps, a pool of 2000)
GRPO_ARGS = {"train.batch_size": 32, "train.num_episodes": 3}
TINY_GRPO = ("grpo", 4.0, CURVE, "grpo", {"batch": 8, "args": GRPO_ARGS})
BUDGET_ARGS = {"train.batch_size": 16, "train.num_episodes": 2}  # episodes ceil(2.4) and ceil(1.2)
TINY_BUDGET = ("dppo-budget", 3.0, CURVE, "grpo", {"batch": 4, "args": BUDGET_ARGS})
DESIGNED = "a control (GRPO at DPPO's budget) that differs by design in "


def _budget_arm(args):
    """TINY_BUDGET with ``args`` changed."""
    return ("dppo-budget", 3.0, CURVE, "grpo", {"batch": 4, "args": BUDGET_ARGS | args})


def test_a_budget_arm_that_differs_in_its_batch_alone_is_comparable_and_named_a_control(tmp_path, rundirs):
    same = {"args": GRPO_ARGS}  # the DPPO arms' flags are GRPO's
    dppo, uniform = DPPO[:4] + (DPPO[4] | same,), UNIFORM[:4] + (UNIFORM[4] | same,)
    rep = sitting(tmp_path, rundirs, [TINY_GRPO, dppo, uniform, TINY_BUDGET])
    budget = rep.comparisons[2]
    assert budget.comparable and budget.control == C.BUDGET
    assert [(d.category, d.key) for d in budget.differences] == [
        ("control (by design)", "rollout.batch_size"),
        ("control (by design)", "train.batch_size"),
        ("control (by design)", "train.num_episodes"),
    ]
    assert not any("not comparable" in w for w in rep.warnings)
    note = DESIGNED + "rollout.batch_size, train.batch_size, train.num_episodes"
    lines = headline(rep)
    assert f"[{note}]" in lines[2] and "[configs differ" not in lines[2]
    assert (
        "[a control (uniform selection) that differs by design in dppo.prompt_policy (uniform)]" in lines[1]
    )
    assert "a control" not in lines[0]  # DPPO itself is no control
    title, headers, rows = speedup_table(rep)
    assert [row[headers.index("comparable")] for row in rows] == [
        "yes",
        "yes; a control (uniform selection) that differs by design in dppo.prompt_policy (uniform)",
        f"yes; {note}",
    ]
    assert "| control (by design) | `rollout.batch_size` | 8 | 4 |" in markdown(rep)
    # episodes rounded up from another batch are the design too: ceil(1.5) = 2 for 5 prompts, not 3 x 5 / 8
    five = _budget_arm({"train.batch_size": 20})
    five[4]["batch"] = 5
    rep = sitting(tmp_path / "b", rundirs, [TINY_GRPO, five])
    assert rep.comparisons[0].comparable and headline(rep)[0].endswith(f"[{note}]")
    # OpenRLHF fills --rollout.vllm_generate_batch_size with each run's own batch: by design too
    gen_base = ("grpo", 4.0, CURVE, "grpo", {"batch": 8, "args": GRPO_ARGS | {C.GENERATE_BATCH: 8}})
    rep = sitting(tmp_path / "c", rundirs, [gen_base, _budget_arm({C.GENERATE_BATCH: 4})])
    assert rep.comparisons[0].comparable, rep.warnings
    assert headline(rep)[0].endswith(
        f"[{DESIGNED}rollout.batch_size, {C.GENERATE_BATCH}, train.batch_size, train.num_episodes]"
    )
    # ... but a generation batch other than the run's own batch is a difference of its own
    rep = sitting(tmp_path / "d", rundirs, [gen_base, _budget_arm({C.GENERATE_BATCH: 6})])
    assert not rep.comparisons[0].comparable
    assert any(f"{C.GENERATE_BATCH} (other OpenRLHF args)" in w for w in rep.warnings)


def test_a_budget_arm_that_differs_in_anything_else_is_still_not_comparable(tmp_path, rundirs):
    cases = (
        ({"actor.learning_rate": 2e-6}, "actor.learning_rate (other OpenRLHF args)"),
        ({"train.batch_size": 8}, "train.batch_size (other OpenRLHF args)"),  # 2 optimizer steps a step
        ({"train.num_episodes": 4}, "train.num_episodes (other OpenRLHF args)"),  # more steps
    )
    for i, (args, flagged) in enumerate(cases):
        rep = sitting(tmp_path / str(i), rundirs, [TINY_GRPO, _budget_arm(args)])
        (warning,) = [w for w in rep.warnings if "not comparable" in w]
        assert warning.startswith(f"dppo-budget is not comparable with grpo: differs in {flagged} (it is ")
        assert "rollout.batch_size (other" not in warning  # the batch itself is by design
        assert "[configs differ: see warnings]" in headline(rep)[0]
        assert not rep.comparisons[0].comparable and rep.comparisons[0].control == C.BUDGET
    # a larger GRPO batch is no control: its batch breaks the comparison
    big_args = {"train.batch_size": 64, "train.num_episodes": 5}
    bigger = ("grpo-16", 3.0, CURVE, "grpo", {"batch": 16, "args": big_args})
    rep = sitting(tmp_path / "big", rundirs, [TINY_GRPO, bigger])
    assert rep.comparisons[0].control is None and not rep.comparisons[0].comparable
    (warning,) = [w for w in rep.warnings if "not comparable" in w]
    assert "rollout.batch_size (other OpenRLHF args)" in warning and "a control" not in warning
