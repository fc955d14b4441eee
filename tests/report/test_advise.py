"""`openrlhf-dppo advise` (report.advise, report.advise_render) on hand-made metrics whose projections are
derived by hand, on the frozen tiny CPU runs, and on bad input; every method's flags parse with the
training CLI and give the configuration the method names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from openrlhf_dppo.cli.advise import build_parser
from openrlhf_dppo.cli.main import main as cli_main
from openrlhf_dppo.core.config import DPPOConfig
from openrlhf_dppo.core.history import SMOOTHING, ZERO_SHARE_CAP
from openrlhf_dppo.report import advise as A
from openrlhf_dppo.report.summary import Settings

DATA = Path(__file__).parent / "data" / "tiny_cpu"
SHARES = [0.2, 0.4, 0.6, 0.6]
TIMES = [10.0, 4.0, 4.0, 8.0]  # step 1 is the warm-up


def make_run(root: Path, name: str, shares=SHARES, times=TIMES, args=None, algo="grpo") -> str:
    """A run of len(shares) steps: step i logs the all-equal share shares[i] and takes times[i] s, half
    of it generation, a tenth the weight sync."""
    d = root / name
    d.mkdir()
    (d / "run_config.json").write_text(json.dumps({"args": args or {}, "algo": algo}))
    (d / "status.json").write_text(json.dumps({"state": "finished", "step": len(shares)}))
    rows = []
    for step, (u, t) in enumerate(zip(shares, times), 1):
        rows.append({"kind": "train", "step": step, "time": step, "wall_time": step, "timing/step_total": t,
                     "timing/generation": t / 2, "timing/broadcast": t / 10, "timing/ppo_train": 0.4 * t,
                     "rollout/equal_reward_frac_ht": u})  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(d)


def by_kind(completion_rate: float = 0.5) -> dict[str, A.Method]:
    found = {m.name: m for m in A.methods(completion_rate)}
    return {
        "grpo": found["GRPO"],
        "dppo": found["DPPO (the defaults)"],
        "uniform": found["DPPO, uniform draw (control)"],
        "completion": found[f"DPPO + completion pruning {completion_rate:g}"],
        "filter": found["GRPO + dynamic filtering"],
    }


def test_the_rates_are_the_default_rate_controls():
    # zero-share from 0.5: the first draw at the configured rate, then the moving average of the shares seen
    assert DPPOConfig().prompt_rate_control == "zero-share" and DPPOConfig().prompt_prune_rate == 0.5
    assert SMOOTHING == 0.8
    r = A.default_rates(SHARES)
    assert r == pytest.approx([0.5, 0.2, 0.8 * 0.2 + 0.2 * 0.4, 0.8 * 0.24 + 0.2 * 0.6])
    assert A.default_rates([0.95] * 3) == pytest.approx([0.5, ZERO_SHARE_CAP, ZERO_SHARE_CAP])  # the cap


def test_each_methods_step_time_by_hand(tmp_path):
    # After the warm-up: (u, r) = (0.4, 0.2), (0.6, 0.24), (0.6, 0.312), steps of 4, 4 and 8 s. At f = 0.5
    # and a sync of 0.1, T / T_grpo = 0.1 + 0.5 gen + 0.4 train.
    a = A.analyse(make_run(tmp_path, "g"), Settings(warmup=1))
    m = A.Machine(0.5, 0.1)
    kinds = by_kind(0.5)

    def weighted(ratios):
        return (4 * ratios[0] + 4 * ratios[1] + 8 * ratios[2]) / 16

    assert A.projection(a, kinds["grpo"], m, 0.5).ratio == pytest.approx(1.0)
    # DPPO: gen = 1 - r, train = (1 - r)(1 - u): the gradient-carrying groups of the rolled-out ones
    gen, train = [0.8, 0.76, 0.688], [0.8 * 0.6, 0.76 * 0.4, 0.688 * 0.4]
    dppo = A.projection(a, kinds["dppo"], m, 0.5)
    assert dppo.ratio == pytest.approx(weighted([0.1 + 0.5 * g + 0.4 * t for g, t in zip(gen, train)]))
    assert dppo.gen == pytest.approx(sum(gen) / 3) and dppo.train == pytest.approx(sum(train) / 3)
    assert A.projection(a, kinds["uniform"], m, 0.5) == dppo  # a draw at chance: the same projection
    # completion pruning at 0.5: train = (1 - r) min(0.5, 1 - u)
    train = [0.8 * 0.5, 0.76 * 0.4, 0.688 * 0.4]
    comp = A.projection(a, kinds["completion"], m, 0.5)
    assert comp.ratio == pytest.approx(weighted([0.1 + 0.5 * g + 0.4 * t for g, t in zip(gen, train)]))
    # dynamic filtering: gen = 1 / (1 - mean u) = 1 / (1 - 1.6 / 3), train = 1, every step alike
    flt = A.projection(a, kinds["filter"], m, 0.5)
    assert flt.ratio == pytest.approx(0.1 + 0.5 / (1 - 1.6 / 3) + 0.4) and flt.speedup < 1.0


def test_without_an_exact_zero_drop_every_rolled_out_group_is_trained(tmp_path):
    kl = {"algo": {"kl": {"init_coef": 0.001}}}
    for name, args in (("kl", kl), ("ent", {"actor": {"entropy_coef": 0.01}}),
                       ("rb", {"algo": {"advantage": {"estimator": "reinforce_baseline"}}})):  # fmt: skip
        a = A.analyse(make_run(tmp_path, name, args=args), Settings())
        assert not a.exact_drop
        p = A.projection(a, by_kind()["dppo"], A.Machine(0.5), 0.5)
        assert p.train == pytest.approx(p.gen)
    assert A.analyse(make_run(tmp_path, "plain"), Settings()).exact_drop


def test_the_runs_own_machine_is_its_median_phases(tmp_path):
    a = A.analyse(make_run(tmp_path, "g"), Settings(warmup=1))
    assert (a.machine.f, a.machine.fixed) == pytest.approx((0.5, 0.1))
    assert a.summary.lossless_ratio == pytest.approx((4 * 0.6 + 4 * 0.4 + 8 * 0.4) / 16)
    assert a.mean_share == pytest.approx(0.45)


def _fits_100_columns(text: str, tmp_path) -> bool:
    """Every console line fits 100 columns, but for a line naming a file under ``tmp_path``."""
    return all(len(line) <= 100 for line in text.splitlines() if str(tmp_path) not in line)


def test_the_console_and_advise_md_give_the_projections_and_the_flags(tmp_path, capsys):
    runs = [make_run(tmp_path, f"g_s{s}") for s in (1, 2)]
    out = tmp_path / "out"
    assert (
        cli_main(["advise", *runs, "--gen-share", "0.7", "--completion-rate", "0.25", "--out", str(out)]) == 0
    )
    text = capsys.readouterr().out
    assert _fits_100_columns(text, tmp_path)
    a = A.analyse(runs[0], Settings())
    kinds = by_kind(0.25)
    for kind in ("dppo", "completion", "filter"):
        own = A.projection(a, kinds[kind], a.machine, 0.25).speedup
        at = A.projection(a, kinds[kind], A.Machine(0.7), 0.25).speedup
        assert f"{kinds[kind].name}" in text and f"{own:.2f}x" in text and f"{at:.2f}x" in text
    for method in A.methods(0.25):
        assert " ".join(method.flags) in " ".join(text.split())
    md = (out / "advise.md").read_text()
    assert "`--dppo.completion_prune_rate 0.25`" in md and "| DPPO (the defaults) |" in md


def test_the_frozen_tiny_cpu_runs_give_f_and_say_what_they_lack(tmp_path, capsys):
    assert cli_main(["advise", str(DATA / "grpo"), str(DATA / "dppo")]) == 0
    text = capsys.readouterr().out
    assert _fits_100_columns(text, tmp_path)
    grpo = A.analyse(str(DATA / "grpo"), Settings())
    assert grpo.machine is not None and f"{grpo.machine.f:.3f}" in text
    flat = " ".join(text.split())
    assert "grpo: no rollout/equal_reward_frac_ht on every step" in flat and "dppo: a dppo run" in flat
    assert "projected step time" not in text  # no share: no projection, and no table of dashes


def test_a_log_in_which_no_group_carried_gradient_says_so_without_a_nan(tmp_path, capsys):
    run = make_run(tmp_path, "eq", shares=[1.0] * 4)
    assert cli_main(["advise", run]) == 0
    text = capsys.readouterr().out
    assert "no group carried gradient" in " ".join(text.split()) and "nan" not in text.lower()
    a = A.analyse(run, Settings())
    assert A.projection(a, by_kind()["filter"], a.machine, 0.5) is None  # it would never fill a batch


def test_bad_input_exits_2_with_the_reason(tmp_path, capsys):
    assert cli_main(["advise", str(tmp_path / "none_*")]) == 2
    assert "matches no run directory" in capsys.readouterr().err
    assert cli_main(["advise", str(tmp_path)]) == 2  # not a run directory
    assert "openrlhf-dppo advise: error:" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--gen-share", "--completion-rate"])
@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.2", "x"])
def test_the_parser_refuses_a_share_outside_0_1_naming_the_flag(tmp_path, capsys, flag, value):
    run = make_run(tmp_path, "g")
    with pytest.raises(SystemExit) as err:
        cli_main(["advise", run, flag, value])
    assert err.value.code == 2 and f"error: argument {flag}: " in capsys.readouterr().err
    assert build_parser().parse_args([run, flag, "0.7"]) is not None


def test_every_methods_flags_run_the_method_through_the_training_cli():
    from openrlhf_dppo._host import prepare_host

    prepare_host()
    from openrlhf_dppo.cli import train_dppo_ray

    base = ["--actor.model_name_or_path", "m", "--data.prompt_dataset", "d", "--reward.remote_url", "r.py",
            "--vllm.num_engines", "1", "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "8"]  # fmt: skip
    parsed = {}
    for kind, method in by_kind(0.25).items():
        got = {}
        argv = base + [w for flag in method.flags for w in flag.split()]
        train_dppo_ray.main(argv, train_fn=lambda a, got=got: got.setdefault("args", a), check_inputs=False)
        parsed[kind] = got["args"]
    assert parsed["grpo"].dppo.method == "grpo" and not parsed["grpo"].algo.dynamic_filtering_enable
    defaults = DPPOConfig()
    for kind in ("dppo", "uniform", "completion"):
        d = parsed[kind].dppo
        assert d.method == "dppo" and d.prompt_rate_control == defaults.prompt_rate_control
        assert d.prompt_prune_rate == defaults.prompt_prune_rate
    assert parsed["dppo"].dppo.prompt_policy == defaults.prompt_policy != "uniform"
    assert parsed["uniform"].dppo.prompt_policy == "uniform"
    assert parsed["completion"].dppo.completion_prune_rate == 0.25 and defaults.completion_prune_rate == 0.0
    f = parsed["filter"]
    assert (
        f.dppo.method == "grpo"
        and f.algo.dynamic_filtering_enable
        and list(f.algo.dynamic_filtering_range) == [0, 1]
    )
