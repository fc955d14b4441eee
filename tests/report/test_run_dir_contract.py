"""The reader against the writer: run directories written by the trainer's own ``RunDir`` (the class
the trainer actor uses) are read by ``load_run`` and compared, with the values the writer produces
(nested args namespaces, tensors, NaN, extra OpenRLHF keys, the generated sample it leaves out)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from openrlhf_dppo.cli.main import main
from openrlhf_dppo.core.config import DPPOConfig
from openrlhf_dppo.report import Settings, build_report, load_run
from openrlhf_dppo.run_dir import RunDir


def _args(out: str, packing: bool) -> SimpleNamespace:
    # the shape of OpenRLHF's hierarchize(args): one namespace per dotted group
    ns = SimpleNamespace
    return ns(
        actor=ns(model_name_or_path=".cache/tiny/model", learning_rate=1e-6),
        rollout=ns(n_samples_per_prompt=4, batch_size=8, max_tokens_per_gpu=4096 if packing else None),
        train=ns(seed=42, dynamic_batch_enable=packing, max_tokens_per_gpu=4096),
        ds=ns(packing_samples=packing, attn_implementation="flash_attention_2" if packing else "eager"),
        data=ns(prompt_dataset="tiny/arith"),
        ckpt=ns(output_dir=out, path=f"{out}/ckpt", max_mem=math.inf),
        logger=ns(wandb=ns(run_name=out)),
        dppo=ns(run_dir=out),
        local_rank=-1,
    )


def _write(path, dppo: DPPOConfig, step_totals, rewards, keep=None):
    run = RunDir(str(path), max_steps=len(step_totals))
    run.write_config(_args(str(path), packing=dppo.method == "dppo"), dppo, dppo.method, [], None)
    run.log("eval", 0, {"eval_arith_pass1": 0.25, "eval_arith_pass4": 0.5})  # before the first step
    run.status("running", 0)
    for step, (total, reward) in enumerate(zip(step_totals, rewards), start=1):
        values = {
            "timing/generation": total / 2,
            "timing/make_experience": total / 4,
            "timing/ppo_train": total / 4,
            "timing/broadcast": 0.0,
            "timing/step_total": total,
            "rollout/reward_mean": torch.tensor(reward),
            "tokens/generated": 64.0,
            "kl": float("nan"),
            "generated_samples": ["text", 1.0],
        }
        if keep is not None:
            values.update({"dppo/prompt_keep_frac": keep[0], "dppo/completion_keep_frac": keep[1]})
        run.log("train", step, values)
    run.log("eval", len(step_totals), {"eval_arith_pass1": 0.5, "eval_arith_pass4": 0.75})
    run.status("finished", len(step_totals))
    return path


def test_compare_reads_what_the_trainer_writes(tmp_path, capsys):
    grpo = _write(tmp_path / "grpo", DPPOConfig(method="grpo"), [9.0, 4.0, 4.0], [0.0, 0.25, 0.5])
    dppo_cfg = DPPOConfig(prompt_prune_rate=0.5, prompt_rate_control="fixed", completion_prune_rate=0.5)
    dppo = _write(tmp_path / "dppo", dppo_cfg, [9.0, 2.0, 2.0], [0.0, 0.25, 0.5], keep=(0.5, 0.5))
    runs = [load_run(grpo), load_run(dppo)]
    assert [r.algo for r in runs] == ["grpo", "dppo"] and all(r.state == "finished" for r in runs)
    assert runs[1].config["args"]["train"]["seed"] == 42  # nested args, as the design says
    assert runs[1].eval_curves() == {"arith": ([0, 3], [0.25, 0.5])}
    assert "generated_samples" not in runs[0].train[0] and runs[0].train[0]["kl"] == "nan"

    rep = build_report(runs, Settings())
    c = rep.comparisons[0]
    # medians after 1 warm-up step: 4 vs 2 -> 2x; f = 2 / 4 = .5; ideal .5 * (.5 + .5 * .5) = .375
    assert c.step_speedup == 2.0 and c.f == 0.5 and c.ideal_ratio == 0.375
    assert c.r_q == 0.5 and c.r_o == 0.5
    assert rep.summaries[1].configured_rates == (0.5, 0.5)
    # only the packing args the DPPO trainer turns on differ: comparable, with a packing note
    assert {d.key for d in c.differences} == {
        "train.dynamic_batch_enable",
        "ds.packing_samples",
        "rollout.max_tokens_per_gpu",
        "ds.attn_implementation",
    }
    assert c.comparable
    assert any("the speedup includes packing gains" in w for w in rep.warnings)

    # the writer's time axis: training time = cumulative step time, start-up apart (first line only)
    assert [row["time/train_s"] for row in runs[1].train] == [9.0, 11.0, 13.0]
    assert [row["time/train_s"] for row in runs[1].evals] == [0.0, 13.0]
    assert ["time/startup_s" in row for row in runs[1].train] == [True, False, False]
    # two eval points per run: read raw (--eval-window 1; the default window 3 has no value to give)
    assert main(["compare", str(grpo), str(dppo), "--eval-window", "1", "--out", str(tmp_path / "rep")]) == 0
    printed = capsys.readouterr().out
    # held-out .25 -> .5 in both runs: target .5 reached at their last eval, 17 s vs 13 s of training
    assert "2.00x" in printed and "matched-accuracy ratio 0.76" in printed
    assert (tmp_path / "rep" / "report.md").is_file() and (tmp_path / "rep" / "heldout.png").is_file()
