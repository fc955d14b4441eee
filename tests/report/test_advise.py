"""`openrlhf-dppo advise` (report.advise, report.selection, report.recommend, report.advise_render) on
hand-made logs whose answer is known (an oracle-predictable task, a task no history can predict), on
the frozen tiny CPU runs, and on bad input."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from openrlhf_dppo import prompt_log
from openrlhf_dppo.cli.advise import build_parser
from openrlhf_dppo.cli.main import main as cli_main
from openrlhf_dppo.report import advise as A
from openrlhf_dppo.report import recommend as R
from openrlhf_dppo.report import selection as SEL
from openrlhf_dppo.report.speedup import ideal_step_ratio
from openrlhf_dppo.report.summary import Settings

DATA = Path(__file__).parent / "data" / "tiny_cpu"
G = 4


def make_run(root: Path, name: str, groups, lengths=None, q=None, gen=0.6, train=0.4, sync=None) -> str:
    """A GRPO run dir: steps of (indices, rewards (n, G)) in metrics.jsonl (equal-reward share, phase
    times gen + train) and prompts.jsonl (optional per-completion lengths, q)."""
    d = root / name
    d.mkdir()
    dppo = {"history_decay": 0.0, "history_prior": 1.0, "q_min": 0.1, "reward_kind": "auto"}
    (d / "run_config.json").write_text(json.dumps({"args": {"dppo": dppo}}))
    (d / "status.json").write_text(json.dumps({"state": "finished", "step": len(groups)}))
    metrics, log = [], []
    for step, (idx, rw) in enumerate(groups, 1):
        share = sum(max(g) == min(g) for g in rw) / len(rw)
        metrics.append({"kind": "train", "step": step, "time": step, "wall_time": step,
                        "timing/generation": gen, "timing/ppo_train": train, "timing/step_total": gen + train,
                        "rollout/equal_reward_frac_ht": share, "rollout/equal_reward_frac": share})  # fmt: skip
        if sync is not None:
            metrics[-1].update({"timing/broadcast": sync, "timing/step_total": gen + train + sync})
        row = {"step": step, "index": idx, "q": q or [1.0] * len(idx), "rewards": rw}
        if lengths is not None:
            row["lengths"] = lengths[step - 1]
        log.append(row)
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in metrics))
    (d / "prompts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    return str(d)


def predictable(steps: int = 10, n: int = 8):
    """Every prompt drawn every step; even prompts always solved (all equal), odd ones half (mixed)."""
    return [(list(range(n)), [[1.0] * G if i % 2 == 0 else [1.0, 0.0] * (G // 2) for i in range(n)])
            for _ in range(steps)]  # fmt: skip


def unpredictable(steps: int = 10, n: int = 8, seed: int = 0):
    """Every prompt drawn every step; each group all equal or mixed by a fair coin, whatever its prompt."""
    rng = random.Random(seed)
    return [(list(range(n)), [[1.0] * G if rng.random() < 0.5 else [0.0, 1.0] * (G // 2) for _ in range(n)])
            for _ in range(steps)]  # fmt: skip


def _fits_100_columns(text: str, tmp_path) -> bool:
    """Every console line fits 100 columns, but for a line naming a file under ``tmp_path`` (a path's
    length is the user's: pytest-xdist's workers add a folder to it)."""
    return all(len(line) <= 100 for line in text.splitlines() if str(tmp_path) not in line)


def _advise(tmp_path, *argv):
    out = tmp_path / "out"
    rc = cli_main(["advise", *argv, "--out", str(out)])
    return rc, out


def test_an_oracle_predictable_log(tmp_path, capsys):
    run = make_run(tmp_path, "g", predictable())
    a = A.analyse(run, Settings(warmup=1), (0.25, 0.5), (1, 2))
    assert a.trend == {
        "mean": 0.5,
        "first_half": 0.5,
        "second_half": 0.5,
        "slope_per_100": pytest.approx(0.0),
    }
    assert a.summary.generation_share == pytest.approx(0.6)
    assert a.lossless == pytest.approx(0.5)  # half of every step's groups carry no gradient
    assert a.recurrence == {"seen_before": 0.9, "distinct": 8.0, "draws_per_prompt": 10.0, "median_gap": 1.0}
    assert a.auc == 1.0  # decay 0: the last group of a prompt foresees the next exactly
    rules = a.replayed
    for r in (0.25, 0.5):
        assert rules["uniform"][r]["kept"] == pytest.approx(1 - r) and rules["uniform"][r][
            "gen"
        ] == pytest.approx(1 - r)
        assert rules["history, unseen mean"][r]["kept"] > rules["uniform"][r]["kept"] + 0.1
    # the oracle at r = 0.5: the 4 all-equal groups at q_min 0.1, the 4 others share 4 - 0.4 -> q = 0.9
    assert rules["oracle"][0.5]["kept"] == pytest.approx(0.9)
    assert rules["oracle"][0.25]["kept"] == pytest.approx(1.0)
    # screening k = 2 alone: the odd prompts' mixed screen [1, 0] scores 1, the even ones' [1, 1] scores
    # 1 - (3/4)^2 = 0.4375 (prior 1): q = c (s) with 4 c + 4 (0.4375 c) = 4 -> c = 1 / 1.4375
    assert rules["screen k=2 alone"][0.5]["kept"] == pytest.approx(1 / 1.4375)
    rc, out = _advise(tmp_path, run, "--rates", "0.25,0.5", "--screen-k", "1,2", "--gen-share", "0.7")
    text = capsys.readouterr().out
    assert rc == 0 and _fits_100_columns(text, tmp_path)
    # zero-share (rate 0.5, the share) keeps 0.616 of the gradient groups, a uniform draw of its cost 0.5
    assert "--dppo.mode recommended --dppo.history_decay 0" in text
    flat = " ".join(text.split())  # the console wraps at 100 columns
    assert "same generation cost (0.50 of GRPO's, keeps 50.0%): the history keeps +11.6%" in flat
    assert "screen_k" not in text and "it is not built" in text
    assert "expected step-time speedup at most" in text and "at gen share 0.70" in text
    assert {p.name for p in out.iterdir()} == {"advise.md", "advise.png"}
    md = (out / "advise.md").read_text()
    assert "| oracle | 0.50 | 0.900 |" in md and "## Recommendation" in md
    assert "| g | 0.900 | 8 | 10.00 | 1 | 1.000 |" in md  # recurrence and the history's AUC
    # asked to keep 90%: zero-share does not, so the fastest rule that does (the history at 0.25, unseen
    # mean: 0.924) is chosen, written as its own flags
    assert cli_main(["advise", run, "--rates", "0.25,0.5", "--screen-k", "2", "--min-kept", "0.9"]) == 0
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    assert "--dppo.prompt_rate_control fixed --dppo.prompt_prune_rate 0.25 --dppo.unseen_prompts mean" in flat
    assert "--dppo.completion_prune_rate 0" in flat and "chosen: history, unseen mean at r = 0.25" in flat


def test_zero_share_with_unseen_mean_is_written_as_the_preset(tmp_path, capsys):
    # G = 4, decay 0: the history keeps about 63% of the gradient groups at the share's rate 0.5, as
    # fast as any rule at that rate; zero-share is chosen (no floor by default): the preset, plus the
    # history setting that differs from the default (decay 0)
    run = make_run(tmp_path, "g", predictable(steps=8))
    assert cli_main(["advise", run, "--rates", "0.25,0.5", "--screen-k", "2"]) == 0
    text = capsys.readouterr().out
    assert "--dppo.mode recommended --dppo.history_decay 0" in text
    assert "chosen: zero-share (its mean rate 0.50)" in text
    # three seeds pooled: the means of equal settings are those settings (0.1 three times, not 0.0999...)
    runs = [make_run(tmp_path, f"g{s}", predictable(steps=8)) for s in (1, 2, 3)]
    assert cli_main(["advise", *runs, "--rates", "0.25,0.5", "--screen-k", "2"]) == 0
    flags = capsys.readouterr().out.split("flags:")[1].split("\n- ")[0].split()
    assert flags == ["--dppo.mode", "recommended", "--dppo.history_decay", "0"]
    assert "--dppo.prompt_rate_control" not in text.split("flags:")[1].split("- ")[0]


def _pt(rule, effective, gen, kept=None):
    return R.Point(rule, 0.5, effective if kept is None else kept, effective, gen, gen)


def test_zero_share_is_replaced_only_by_a_rule_that_dominates_it():
    f = A.Machine(0.5)
    zero = _pt("zero-share", 0.70, 0.60)
    faster_less_effective = _pt("history, unseen mean", 0.60, 0.50)
    slower_more_effective = _pt("history, unseen keep", 0.90, 0.80)
    tie = _pt("history, unseen mean", 0.71, 0.595)  # within 2% on both: not better
    better = _pt("history, unseen keep", 0.75, 0.55)
    for other in (faster_less_effective, slower_more_effective, tie):
        assert not R.dominates(other, zero, f)
        assert R.choose([zero, other], f, 0.6) is zero
    assert R.dominates(better, zero, f) and R.choose([zero, faster_less_effective, better], f, 0.6) is better
    # zero-share under the floor: the fastest candidate above it
    low = _pt("zero-share", 0.55, 0.45)
    assert R.choose([low, slower_more_effective, faster_less_effective], f, 0.6) is faster_less_effective
    assert R.choose([low], f, 0.6) is None


def test_the_uniform_reference_is_taken_at_the_chosen_rules_cost():
    pts = [_pt("uniform", 0.75, 0.75), _pt("uniform", 0.5, 0.5), _pt("zero-share", 0.8, 0.6)]
    assert R.uniform_at(pts, 0.6) == pytest.approx(0.6)
    assert R.uniform_at(pts, 0.9) == pytest.approx(0.9)  # between r = 0.25 and GRPO (1, 1)
    assert R.uniform_at(pts[2:], 0.6) is None


def test_there_is_no_kept_floor_by_default():
    assert build_parser().parse_args(["r"]).min_kept is None
    low = _pt("zero-share", 0.41, 0.41)
    assert R.choose([low, _pt("history, unseen mean", 0.75, 0.75)], A.Machine(0.3)) is low


def test_a_log_no_history_can_predict(tmp_path, capsys):
    runs = [make_run(tmp_path, f"u_s{s}", unpredictable(steps=16, seed=s)) for s in (1, 2)]
    advice = [A.analyse(r, Settings(), (0.5,), (2,)) for r in runs]
    for a in advice:
        hist, uni = a.replayed["history, unseen mean"][0.5], a.replayed["uniform"][0.5]
        assert hist["kept"] == pytest.approx(uni["kept"], abs=0.08)  # no better than a uniform draw
        assert 0.3 < a.auc < 0.7
    rc, _ = _advise(tmp_path, *runs, "--rates", "0.25,0.5", "--screen-k", "2")
    text = capsys.readouterr().out
    assert rc == 0
    # half of the groups carry gradient at random: zero-share (rate 0.46) keeps 55% of them, no better than
    # a uniform draw, and its spread weights make it less effective (0.514) than the uniform policy at its
    # rate (0.536): that control dominates it and is chosen, said to be a smaller batch at random; the
    # advice says what keeping 75% would cost
    flat = " ".join(text.split())
    assert "chosen: zero-share uniform (its mean rate 0.46)" in flat
    assert "--dppo.mode recommended --dppo.prompt_policy uniform" in flat
    assert "the uniform policy selects nothing" in flat
    assert "the history is no better than a uniform draw here" in flat
    assert "to keep more of them: 75% at 1.64x (--min-kept 0.75: sqrt, unseen mean, r = 0.25)" in flat
    rc, _ = _advise(tmp_path, *runs, "--rates", "0.25,0.5", "--screen-k", "2", "--min-kept", "0.6")
    flat = " ".join(capsys.readouterr().out.split())
    assert rc == 0 and "chosen: sqrt, unseen mean at r = 0.25" in flat  # zero-share is under 0.6
    rc, _ = _advise(tmp_path, *runs, "--rates", "0.25,0.5", "--screen-k", "2", "--min-kept", "0.9")
    text = capsys.readouterr().out
    assert rc == 0  # nothing keeps 90% of them at a real saving
    assert "no buildable rule keeps 90% of the gradient-carrying groups" in text and "flags:" not in text


def test_the_frozen_tiny_cpu_runs_give_f_and_say_what_they_lack(tmp_path, capsys):
    rc, out = _advise(tmp_path, str(DATA / "grpo"), str(DATA / "dppo"))
    text = capsys.readouterr().out
    assert rc == 0 and _fits_100_columns(text, tmp_path)
    grpo = A.analyse(str(DATA / "grpo"), Settings(), (0.5,), (2,))
    assert grpo.summary.generation_share is not None and f"{grpo.summary.generation_share:.3f}" in text
    assert grpo.replayed is None and grpo.share_source is None
    assert "grpo: no prompt log" in text and "dppo: a dppo run" in text
    assert "no rule can be chosen (no GRPO prompt log to replay)" in text
    assert (out / "advise.md").is_file() and not (out / "advise.png").exists()


def test_a_dppo_prompt_log_is_not_replayed(tmp_path):
    run = make_run(tmp_path, "d", predictable(steps=4), q=[0.5] * 8)
    a = A.analyse(run, Settings(), (0.5,), (2,))
    assert a.replayed is None and a.recurrence is not None
    assert any("q < 1 (a DPPO run)" in n for n in a.notes)


def test_expected_longest_matches_enumerating_the_draws():
    rng = np.random.default_rng(3)
    longest, q = rng.integers(1, 20, 6).astype(float), rng.uniform(0.1, 1.0, 6)
    brute = 0.0
    for kept in itertools.product([0, 1], repeat=6):
        mask = np.array(kept, bool)
        p = np.prod(np.where(mask, q, 1 - q))
        brute += p * (longest[mask].max() if mask.any() else 0.0)
    assert SEL.expected_longest(longest, q) == pytest.approx(brute, abs=1e-12)


def test_screen_scores_by_hand():
    # G = 4, k = 2, prior 1, alone: a mixed screen -> 1; [1, 1] -> p = 3/4, s = 1 - (3/4)^2; [0, 0] -> same
    rewards = np.array([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    s = SEL.screen_scores(rewards, 2, np.zeros(3), np.zeros(3), 1.0)
    assert s.tolist() == pytest.approx([1.0, 1 - 0.75**2, 1 - 0.75**2])
    # with a history of 4 successes in 4: p = (1 + 2 + 4) / (2 + 2 + 4) = 7/8 for the [1, 1] screen
    s = SEL.screen_scores(rewards[1:2], 2, np.array([4.0]), np.array([4.0]), 1.0)
    assert s.tolist() == pytest.approx([1 - (7 / 8) ** 2])


def test_screening_round_2_is_charged_from_the_logged_lengths(tmp_path):
    steps = predictable(steps=4)
    short = [[[100, 100, 1, 1] for _ in range(8)] for _ in steps]  # round 2 (k = 2) holds only 1-token ones
    plain = A.analyse(make_run(tmp_path, "a", steps), Settings(), (0.5,), (2,))
    timed = A.analyse(make_run(tmp_path, "b", steps, lengths=short), Settings(), (0.5,), (2,))
    rule = "screen k=2 alone"
    assert plain.replayed[rule][0.5]["gen"] == pytest.approx(0.5 + 1.0)  # round 2 charged a whole round
    # with lengths: round 1 holds 200 of the 202 tokens of a group; round 2's longest is 1 of the step's 100
    t1 = 200 / 202
    gen = timed.replayed[rule][0.5]["gen"]
    assert t1 < gen < t1 + 0.02 and timed.lengths_logged and not plain.lengths_logged
    assert any("no completion lengths" in n for n in plain.notes)


def test_the_step_ratio_is_the_ideal_formula_for_one_round_rules():
    for f, r in ((0.3, 0.5), (0.7, 0.25), (1.0, 0.9)):
        assert A.step_ratio(f, 1 - r, 1 - r) == pytest.approx(ideal_step_ratio(f, r, 0.0))


def test_the_prompt_log_keeps_optional_lengths(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    prompt_log.append(tmp_path, 1, [3], [1.0], [[1.0, 0.0]], lengths=[[5, 7]])
    assert prompt_log.read(tmp_path)[0][prompt_log.LENGTHS] == [[5, 7]]
    with pytest.raises(ValueError, match="one length per reward"):
        prompt_log.append(tmp_path, 2, [3], [1.0], [[1.0, 0.0]], lengths=[[5]])


def test_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    run = make_run(tmp_path, "g", predictable(steps=2))
    for argv, says in [
        ([run, "--rates", "0.95"], "--rates must lie in (0, 1 - q_min = 0.9]"),
        ([run, "--rates", "1.5"], "--rates must lie in"),
        ([run, "--rates", "x"], "--rates must be numbers"),
        ([run, "--min-kept", "0"], "--min-kept must be in"),
        ([str(tmp_path / "none_*")], "matches no run directory"),
    ]:
        assert cli_main(["advise", *argv]) == 2
        assert says in capsys.readouterr().err
    assert cli_main(["--help"]) == 0 and "advise" in capsys.readouterr().out


@pytest.mark.parametrize("share", ["0", "1", "1.5", "-0.2", "x"])
def test_the_parser_refuses_a_generation_share_outside_0_1_naming_the_flag(tmp_path, capsys, share):
    # 0 would make a step of training alone free of generation, 1 one of generation alone: a division by
    # zero in a log where no rule trains anything, and no machine either way
    run = make_run(tmp_path, "g", predictable(steps=2))
    with pytest.raises(SystemExit) as err:
        cli_main(["advise", run, "--gen-share", share])
    assert err.value.code == 2
    assert "error: argument --gen-share: " in capsys.readouterr().err
    assert build_parser().parse_args([run, "--gen-share", "0.7"]).gen_share == 0.7


def all_equal(steps: int = 10, n: int = 8):
    """Every prompt drawn every step; every group all equal (half all solved, half all failed)."""
    return [(list(range(n)), [[float(i % 2)] * G for i in range(n)]) for _ in range(steps)]


def test_a_log_in_which_no_group_carried_gradient_says_so_without_a_speedup_or_a_nan(tmp_path, capsys):
    run = make_run(tmp_path, "eq", all_equal())
    a = A.analyse(run, Settings(), (0.25, 0.5), (1, 2))
    assert a.no_gradient and a.replayed is None and a.trend["mean"] == 1.0
    for extra in ([], ["--gen-share", "0.5"]):
        rc, out = _advise(tmp_path, run, *extra)
        text = capsys.readouterr().out
        flat = " ".join(text.split())
        assert rc == 0
        assert "no group carried gradient (every group's G rewards were equal); nothing to select" in flat
        assert "nan" not in text.lower() and "x at" not in text and "flags:" not in text
        assert "selection rules replayed" not in text and "screening" not in text
        assert "nan" not in (out / "advise.md").read_text().lower() and not (out / "advise.png").exists()
    # pooled with a run whose groups do carry gradient: that run alone is replayed, and no nan spreads
    other = make_run(tmp_path, "g", predictable())
    rc, _ = _advise(tmp_path, run, other, "--rates", "0.25,0.5", "--screen-k", "2")
    text = capsys.readouterr().out
    assert rc == 0 and "nan" not in text.lower() and "chosen: zero-share" in text
    assert "eq: no group carried gradient" in " ".join(text.split())


def test_training_cost_counts_only_the_gradient_groups_where_the_exact_zero_drop_is_on(tmp_path):
    """Half the groups are all equal: a uniform draw at r = 0.5 generates half of GRPO's tokens and, with
    the trainer's exact drop of advantage-0 completions, trains only its mixed groups (a quarter); with
    a KL term in the run's flags (no exact drop) it trains all it generates."""
    steps = predictable(steps=4)
    plain = A.analyse(make_run(tmp_path, "a", steps), Settings(), (0.5,), ())
    assert plain.replayed["uniform"][0.5]["gen"] == pytest.approx(0.5)
    assert plain.replayed["uniform"][0.5]["train"] == pytest.approx(0.25)
    kl = make_run(tmp_path, "kl", steps)
    cfg = json.loads((Path(kl) / "run_config.json").read_text())
    cfg["args"]["algo"] = {"kl": {"init_coef": 0.01}}
    (Path(kl) / "run_config.json").write_text(json.dumps(cfg))
    with_kl = A.analyse(kl, Settings(), (0.5,), ())
    assert with_kl.replayed["uniform"][0.5]["train"] == pytest.approx(0.5)
    assert A.zero_drop_allowed({}) and not A.zero_drop_allowed({"actor": {"entropy_coef": 0.01}})
    assert not A.zero_drop_allowed({"algo": {"advantage": {"estimator": "reinforce_baseline"}}})
    assert not A.zero_drop_allowed({"dppo": {"drop_zero_advantage": False}})


def test_a_rule_is_read_at_a_speed_between_its_replayed_rates():
    f = A.Machine(1.0)  # speedup = 1 / gen
    curve = [_pt("screen k=2 alone", 0.9, 0.8), _pt("screen k=2 alone", 0.5, 0.4)]  # 1.25x and 2.5x
    assert R.effective_at_speed(curve, 1.875, f) == (pytest.approx(0.7), "exact")
    assert R.effective_at_speed(curve, 1.1, f) == (0.9, "at least")  # faster than asked at every rate
    assert R.effective_at_speed(curve, 3.0, f) == (0.5, "at most")  # slower than asked at every rate
    assert R.effective_at_speed([], 2.0, f) == (None, "")


def test_screening_pays_only_where_it_beats_the_chosen_rule_at_its_speed():
    f = A.Machine(1.0)
    chosen = _pt("zero-share", 0.70, 0.5)  # 2x
    good = [_pt("screen k=2 + history", 0.9, 0.45), _pt("screen k=2 + history", 0.6, 0.55)]  # 0.75 at 2x
    poor = [_pt("screen k=1 alone", 0.8, 0.8), _pt("screen k=1 alone", 0.6, 0.6)]  # slower: at most 0.6
    assert R._screening(good + poor, chosen, f, 0.6)[0] == "would pay"
    verdict, line = R._screening(poor, chosen, f, 0.6)
    assert verdict == "would not pay" and "at most 60.0%" in line and "zero-share's 70.0%" in line
    # slower at every replayed rate but more effective at its highest: what a higher rate gives is not told
    rich = [_pt("screen k=4 alone", 0.95, 0.9), _pt("screen k=4 alone", 0.8, 0.7)]
    verdict, line = R._screening(rich, chosen, f, 0.6)
    assert verdict == "not told" and "widen --rates" in line
    assert R._screening([], chosen, f, 0.6) == ("not told", "")


def test_the_weight_sync_is_held_fixed(tmp_path):
    # a step of 1 s: generation 0.5, the rest 0.3, the weight sync 0.2 (whatever the rollout holds)
    run = make_run(tmp_path, "g", predictable(), gen=0.5, train=0.3, sync=0.2)
    m = A.measured_machine([A.analyse(run, Settings(), (0.5,), ())])
    assert (m.f, m.fixed) == (pytest.approx(0.5), pytest.approx(0.2))
    half = R.Point("uniform", 0.5, 0.5, 0.5, 0.5, 0.5)
    assert half.speedup(m) == pytest.approx(1 / (0.2 + 0.5 * 0.5 + 0.3 * 0.5))  # 1.67x, not 2x
    assert half.speedup(A.Machine(0.5)) == pytest.approx(2.0)  # --gen-share's machine holds nothing fixed
    with pytest.raises(ValueError, match="shares of one step"):
        A.step_ratio(0.7, 0.5, 0.5, fixed=0.4)


def test_the_uniform_reference_counts_the_weights_spread_too():
    # a history that rolls out more gradient groups than a uniform draw of its cost, with weights so
    # spread that its effective share is lower: the advice says both
    line = R._against_uniform(R.Point("zero-share", 0.6, 0.545, 0.333, 0.389, 0.2), 0.389)
    assert "keeps +15.6% of the gradient groups, -5.6% in effective share" in line
    assert "cost more variance than its foresight saves" in line
    line = R._against_uniform(R.Point("zero-share", 0.6, 0.50, 0.50, 0.5, 0.2), 0.5)
    assert line.endswith("the history is no better than a uniform draw here")


def test_a_log_that_never_repeats_a_prompt_is_a_blind_draw_for_every_policy(tmp_path):
    """Every step draws 8 new prompts: no group is of a seen prompt, and at the recommended mode's rate every
    policy's draw of the unseen prompts is uniform: its effective share over a uniform draw at equal cost
    is 0 exactly, while the oracle's shows the headroom."""
    rng = random.Random(5)
    groups = [(list(range(8 * s, 8 * s + 8)), [[1.0] * G if rng.random() < 0.5 else [0.0, 1.0] * (G // 2)
               for _ in range(8)]) for s in range(12)]  # fmt: skip
    a = A.analyse(make_run(tmp_path, "new", groups), Settings(), (0.5,), ())
    for rule in ("zero-share", "zero-share sqrt", "zero-share uniform"):
        cell = a.replayed[rule][0.0]
        assert cell["grad_seen"] == 0 and np.isnan(cell["effective_seen"])
        assert cell["grad_unseen"] == cell["grad_seen"] + sum(
            sum(max(g) != min(g) for g in rw) for _, rw in groups
        )
        assert cell["effective_unseen"] == pytest.approx(cell["uniform_unseen"], abs=1e-12)
    oracle = a.replayed["zero-share oracle"][0.0]
    assert oracle["effective_unseen"] > oracle["uniform_unseen"] + 0.2
    over = R.over_uniform([a])
    assert over["zero-share sqrt"]["unseen"] == pytest.approx(0.0, abs=1e-12) and np.isnan(
        over["zero-share"]["seen"]
    )


def test_seen_and_unseen_groups_are_split_by_the_history_before_the_step(tmp_path):
    # the predictable log: step 1's prompts are unseen (4 of its groups carry gradient), the 9 later steps'
    # are seen (36); the uniform policy's effective share equals its equal-cost uniform draw's on both
    a = A.analyse(make_run(tmp_path, "g", predictable()), Settings(), (0.5,), ())
    uni, prop = a.replayed["zero-share uniform"][0.0], a.replayed["zero-share"][0.0]
    assert (uni["grad_unseen"], uni["grad_seen"]) == (4, 36)
    for subset in ("seen", "unseen"):
        assert uni[f"effective_{subset}"] == pytest.approx(uni[f"uniform_{subset}"])
    # decay 0: a seen prompt's last group foresees the next, so the history beats chance on seen prompts only
    assert prop["effective_seen"] > prop["uniform_seen"] + 0.1
    assert prop["effective_unseen"] == pytest.approx(prop["uniform_unseen"])


def test_the_sqrt_rule_reads_the_logged_lengths_as_costs(tmp_path):
    """Every group is mixed alike; even prompts' completions are 100 tokens, odd ones' 4. With lengths the
    history learns the costs and the sqrt rule (budget: expected cost) keeps the cheap prompts more often,
    so it rolls out more gradient groups than proportional at the same generation cost; without lengths
    every cost is alike and the two agree."""
    steps = [(list(range(8)), [[1.0, 0.0] * (G // 2)] * 8) for _ in range(6)]
    lengths = [[[100] * G if i % 2 == 0 else [4] * G for i in range(8)] for _ in steps]
    timed = A.analyse(make_run(tmp_path, "t", steps, lengths=lengths), Settings(), (0.5,), ())
    plain = A.analyse(make_run(tmp_path, "p", steps), Settings(), (0.5,), ())
    # every group carries gradient, so zero-share's rate is 0 after step 1: compare at the fixed rate 0.5
    sq, prop = timed.replayed["sqrt, unseen mean"][0.5], timed.replayed["history, unseen mean"][0.5]
    assert sq["kept_seen"] > prop["kept_seen"] + 0.1 and sq["gen"] == pytest.approx(prop["gen"], abs=0.02)
    assert sq["effective_seen"] > sq["uniform_seen"] + 0.1  # cheap gradient groups: more of them per token
    p_sq, p_prop = plain.replayed["sqrt, unseen mean"][0.5], plain.replayed["history, unseen mean"][0.5]
    assert p_sq["kept_seen"] == pytest.approx(p_prop["kept_seen"]) == pytest.approx(0.5)


def test_a_sqrt_rule_that_dominates_is_written_with_its_policy(tmp_path):
    f = A.Machine(0.5)
    zero = _pt("zero-share", 0.60, 0.50)
    sqrt = _pt("zero-share sqrt", 0.66, 0.50)
    assert R.choose([zero, sqrt], f) is sqrt
    a = A.analyse(make_run(tmp_path, "g", predictable(steps=2)), Settings(), (0.5,), ())
    flags = R._flags(sqrt, [a])
    assert flags[:2] == ["--dppo.mode recommended", "--dppo.prompt_policy sqrt"]
    fixed = R._flags(_pt("sqrt, unseen keep", 0.7, 0.5), [a])
    assert "--dppo.prompt_rate_control fixed" in fixed and "--dppo.prompt_policy sqrt" in fixed
    assert "--dppo.unseen_prompts keep" in fixed
    assert "--dppo.prompt_policy" not in " ".join(R._flags(zero, [a]))
