"""The train_dppo_ray entry point runs OpenRLHF 0.11.2's own parser and validation, plus --dppo.*.

These tests run in-process and stop before Ray: ``main(argv, train_fn=...)`` hands the validated
namespace to a capture. tests/cli/test_bad_input.py runs the CLI as a user would.
"""

import re
from types import SimpleNamespace

import pytest
from cli_commands import DPPO, GRPO, parse, replaced, without

from openrlhf_dppo.cli import train_dppo_ray as cli
from openrlhf_dppo.cli.flags import build_options, flag_specs
from openrlhf_dppo.core import DPPOConfig


def test_grpo_command_plus_dppo_flags_goes_through_openrlhf_validation():
    args = parse(GRPO + DPPO)
    d = args.dppo
    assert (d.prompt_prune_rate, d.prompt_rate_control, d.completion_prune_rate) == (0.3, "fixed", 0.5)
    assert (d.prompt_policy, d.q_min, d.p_min, d.seed) == ("uniform", 0.2, 0.05, 7)
    assert (d.short_batch, d.method, d.run_dir, d.max_steps) == ("drop", "dppo", None, None)
    # DPPO turned on the packing path; OpenRLHF's own validation then derived the rest from it
    assert args.train.dynamic_batch_enable is True
    assert args.ds.packing_samples is True
    assert args.rollout.max_tokens_per_gpu == 16384
    # other OpenRLHF validation side effects prove its main block ran, not a copy
    assert args.reward.remote_url == ["examples/reward_func.py"]
    assert args.actor.eps_clip_low_high == (0.2, 0.2)
    assert args.critic.model_name_or_path is None
    assert args.rollout.vllm_generate_batch_size == 16
    assert args.algo.kl.use_loss and args.algo.kl.estimator == "k3"
    cfg, run = build_options(vars(args.dppo))
    assert cfg.completion_prune_rate == 0.5 and cfg.prompt_policy == "uniform" and cfg.method == "dppo"
    assert run.run_dir is None and run.max_steps is None


def test_method_grpo_leaves_the_grpo_namespace_untouched():
    plain = parse(GRPO)  # DPPO on by default: dynamic batch switched on
    off = parse(GRPO + ["--dppo.method", "grpo", "--dppo.completion_prune_rate", "0.5"])
    assert plain.train.dynamic_batch_enable is True
    assert off.dppo.method == "grpo"
    assert off.train.dynamic_batch_enable is False and off.ds.packing_samples is False
    assert off.rollout.max_tokens_per_gpu is None


def test_every_flag_defaults_to_its_field_default_and_run_options_parse():
    args = parse(GRPO)
    for spec in flag_specs():
        assert getattr(args.dppo, spec.name) == spec.default, spec.name
    assert build_options(vars(args.dppo))[0] == DPPOConfig()
    run = parse(
        GRPO + ["--dppo.max_steps", "3", "--dppo.run_dir", "/tmp/r", "--dppo.schedule_steps", "9"]
    ).dppo
    assert (run.max_steps, run.run_dir, run.schedule_steps) == (3, "/tmp/r", 9)


@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--dppo.q_min", "0"], "--dppo.q_min"),
        (["--dppo.completion_prune_rate", "1.0"], "--dppo.completion_prune_rate"),
        (["--dppo.p_min", "0.9", "--dppo.completion_prune_rate", "0.5"], "--dppo.p_min"),
        (["--dppo.prompt_prune_rate", "0.8"], "--dppo.prompt_prune_rate"),
        (["--dppo.q_min", "0.4"], "--dppo.q_min"),
        (["--dppo.method", "maybe"], "--dppo.method"),
        (["--dppo.prompt_policy", "sqrt"], "--dppo.prompt_policy"),
        (["--dppo.max_steps", "0"], "--dppo.max_steps"),
        (["--dppo.schedule_steps", "0"], "--dppo.schedule_steps"),
        (["--dppo.max_steps", "10", "--dppo.schedule_steps", "9"], "--dppo.schedule_steps"),
        (["--algo.advantage.estimator", "gae", "--critic.model_name_or_path", "x"], "--algo.advantage.estimator"),
        (["--algo.advantage.estimator", "reinforce"], "--algo.advantage.estimator"),
        (["--train.partial_rollout_enable"], "--train.partial_rollout_enable"),
        (["--rollout.vllm_generate_batch_size", "8"], "--rollout.vllm_generate_batch_size"),
        (["--actor.aux_loss_coef", "0.01"], "--actor.aux_loss_coef"),
        (["--rollout.max_new_tokens", "4096"], "--rollout.max_new_tokens"),
        (["--train.max_tokens_per_gpu", "0"], "--train.max_tokens_per_gpu"),
        (["--rollout.max_tokens_per_gpu", "-1"], "--rollout.max_tokens_per_gpu"),
        (["--rollout.n_samples_per_prompt", "1"], "--rollout.n_samples_per_prompt"),
    ],
)  # fmt: skip
def test_bad_values_and_combinations_fail_naming_the_flag(extra, flag, capsys):
    argv = [a for a in GRPO if a not in ("--vllm.enable_sleep",)] + extra
    called = []
    with pytest.raises(SystemExit) as exc:
        cli.main(argv, train_fn=called.append)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
    assert not called


@pytest.mark.parametrize(
    "bad", [["--dppo.method", "maybe"], ["--dppo.enable", "false"], ["--dppo.enable=true"]]
)
def test_a_bad_method_or_the_old_enable_flag_fails_naming_dppo_method_and_its_choices(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(GRPO + bad, train_fn=lambda a: None)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--dppo.method" in err and "grpo" in err and "dppo" in err


def test_dppo_flags_are_checked_before_openrlhf_validation_which_needs_vllm_for_packing(capsys):
    # OpenRLHF's own validation would stop first with a TypeError (None > 0) on the missing engines
    argv = without(GRPO, "--vllm.num_engines") + ["--dppo.q_min", "0"]
    with pytest.raises(SystemExit) as exc:
        cli.main(argv, train_fn=lambda a: None)
    assert exc.value.code == 2 and "--dppo.q_min" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(without(GRPO, "--vllm.num_engines"), train_fn=lambda a: None)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--vllm.num_engines: DPPO needs vLLM engines" in err


def test_rewards_must_come_with_the_rollouts_from_a_reward_function_or_an_agent(capsys):
    argv = without(GRPO, "--reward.remote_url") + ["--reward.model_name_or_path", "some/rm"]
    with pytest.raises(SystemExit):
        cli.main(argv, train_fn=lambda a: None)
    assert "--reward.remote_url: DPPO needs the rewards on the rollouts" in capsys.readouterr().err
    # an agent function also puts rewards on the rollouts (OpenRLHF then sets remote_url to "agent")
    args = parse(without(GRPO, "--reward.remote_url") + ["--train.agent_func_path", "agent.py"])
    assert args.reward.remote_url == ["agent"] and args.dppo.method == "dppo"


def test_grpo_baseline_keeps_openrlhf_flags_dppo_refuses():
    """--dppo.method grpo runs what OpenRLHF runs: DPPO's requirements do not apply to it."""
    off = ["--dppo.method", "grpo"]
    grpo = [without(GRPO, "--reward.remote_url") + ["--reward.model_name_or_path", "some/rm"]]
    grpo += [
        replaced(GRPO, "--algo.advantage.estimator", "reinforce"),
        GRPO + ["--actor.aux_loss_coef", "0.01"],
    ]
    grpo += [GRPO + ["--data.max_len", "20000"], GRPO + ["--rollout.vllm_generate_batch_size", "8"]]
    for argv in grpo:
        assert parse(argv + off).dppo.method == "grpo"


@pytest.mark.parametrize(
    "source, why",
    [
        ("if __name__ == '__main__':\n    args = None\n    train(args)\n", "one `args = parser.parse_args()`"),
        ("if __name__ == '__main__':\n    args = parser.parse_args([])\n    train(args)\n",
         "one `args = parser.parse_args()`"),
        ("if __name__ == '__main__':\n    args = parser.parse_args()\n    train(args)\n    x = 1\n",
         "end with `train(args)`"),
        ("if __name__ == '__main__':\n    pass\nif __name__ == '__main__':\n    pass\n", "found 2"),
        ("import ray\nif __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n"
         "    args = parser.parse_args()\n    ray.init()\n    train(args)\n",
         "uses `ray`, which is not bound by one standard-library import"),
    ],
    ids=["no-parse", "parse-with-arguments", "train-not-last", "two-main-blocks", "non-stdlib-global"],
)  # fmt: skip
def test_a_script_of_another_shape_is_refused_loudly(tmp_path, source, why):
    bad = tmp_path / "train_ppo_ray.py"
    bad.write_text("import argparse\n\ndef train(args):\n    pass\n\n" + source)
    with pytest.raises(RuntimeError, match=r"OpenRLHF 0\.11\.2.*" + re.escape(why)):
        cli._load_openrlhf_main(str(bad))


def test_only_the_main_block_and_its_stdlib_imports_are_run(tmp_path):
    script = tmp_path / "train_ppo_ray.py"
    script.write_text(
        "import argparse\nimport ray\nfrom datetime import datetime\n\ndef train(args):\n    raise SystemExit\n\n"
        "if __name__ == '__main__':\n    parser = argparse.ArgumentParser()\n    args = parser.parse_args()\n"
        "    args.when = datetime\n    train(args)\n"
    )
    _, module = cli._load_openrlhf_main(str(script))
    seen = {}
    namespace = {
        "__name__": "__main__",
        cli.PARSE_HOOK: lambda parser: seen.setdefault("parser", parser).parse_args([]),
        cli.TRAIN_HOOK: lambda args: seen.setdefault("args", args),
    }
    exec(compile(module, str(script), "exec"), namespace)  # `import ray` and `def train` are not run
    assert "ray" not in namespace and "train" not in namespace
    assert seen["args"].when.__name__ == "datetime" and seen["parser"].prog


def test_install_points_openrlhf_at_the_dppo_classes():
    from openrlhf.cli import train_ppo_ray
    from openrlhf.trainer import ppo_trainer, ppo_trainer_async

    from openrlhf_dppo.adapters import install
    from openrlhf_dppo.adapters.actor import DPPOPolicyModelActor
    from openrlhf_dppo.adapters.async_trainer import DPPOTrainerAsync

    # the replacements are Ray actor classes again, wrapping subclasses of OpenRLHF's Python classes
    from openrlhf_dppo.adapters.step import unwrap_actor_class
    from openrlhf_dppo.adapters.trainer import DPPOTrainer
    from openrlhf_dppo.run_dir import RunMeta

    cfg, run = DPPOConfig(completion_prune_rate=0.3), RunMeta(argv=["--x"], start_time=1.0)
    replaced_classes = install(cfg, run)
    try:
        # OpenRLHF's train() calls PPOTrainer.remote(...): the DPPO trainer gets the CLI's config and
        # the run metadata as constructor arguments (the same objects: nothing rebuilt)
        factory = ppo_trainer.PPOTrainer
        assert factory.trainer_class is DPPOTrainer and factory.dppo is cfg and factory.run is run
        # under --train.async_enable train() imports PPOTrainerAsync from its module when it runs
        async_factory = ppo_trainer_async.PPOTrainerAsync
        assert async_factory.trainer_class is DPPOTrainerAsync and async_factory.dppo is cfg
        assert async_factory.run is run
        assert issubclass(
            unwrap_actor_class(DPPOTrainerAsync), unwrap_actor_class(replaced_classes["PPOTrainerAsync"])
        )
        assert train_ppo_ray.PolicyModelActor is DPPOPolicyModelActor
        assert issubclass(unwrap_actor_class(DPPOTrainer), unwrap_actor_class(replaced_classes["PPOTrainer"]))
        stand_in = type(factory)(SimpleNamespace(remote=lambda *a, **k: (a, k)), cfg, run)
        assert stand_in.remote("model", "strategy", temperature=1.0) == (
            ("model", "strategy"),
            {"dppo": cfg, "run": run, "temperature": 1.0},
        )
        assert issubclass(
            unwrap_actor_class(DPPOPolicyModelActor), unwrap_actor_class(replaced_classes["PolicyModelActor"])
        )
        assert DPPOPolicyModelActor._default_options == replaced_classes["PolicyModelActor"]._default_options
    finally:
        ppo_trainer.PPOTrainer = replaced_classes["PPOTrainer"]
        ppo_trainer_async.PPOTrainerAsync = replaced_classes["PPOTrainerAsync"]
        train_ppo_ray.PolicyModelActor = replaced_classes["PolicyModelActor"]
    # --dppo.method grpo: the same three (the actor counts what GRPO trains and trains its short batches)
    actor = train_ppo_ray.PolicyModelActor
    replaced_classes = install(DPPOConfig(method="grpo"), RunMeta())
    try:
        assert set(replaced_classes) == {"PPOTrainer", "PPOTrainerAsync", "PolicyModelActor"}
        assert replaced_classes["PolicyModelActor"] is actor
        assert train_ppo_ray.PolicyModelActor is DPPOPolicyModelActor
    finally:
        ppo_trainer.PPOTrainer = replaced_classes["PPOTrainer"]
        ppo_trainer_async.PPOTrainerAsync = replaced_classes["PPOTrainerAsync"]
        train_ppo_ray.PolicyModelActor = replaced_classes["PolicyModelActor"]


def test_the_cli_hands_its_validated_config_and_run_options_to_install(monkeypatch):
    """The trainer reads --dppo.run_dir, --dppo.max_steps and --dppo.schedule_steps from the RunMeta the CLI passes, never
    from the namespace: the CLI's validated objects reach ``install`` as they are."""
    from openrlhf.cli import train_ppo_ray

    import openrlhf_dppo.adapters as adapters

    seen = {}
    monkeypatch.setattr(cli, "_apply_cpu_compat", lambda args: None)
    monkeypatch.setattr(adapters, "install", lambda cfg, run: seen.update(cfg=cfg, run=run))
    monkeypatch.setattr(train_ppo_ray, "train", lambda args: "trained")
    argv = (
        GRPO
        + DPPO
        + ["--dppo.run_dir", "/tmp/dppo_run", "--dppo.max_steps", "12", "--dppo.schedule_steps", "30"]
    )
    assert cli.main(argv, check_inputs=False) == "trained"
    assert seen["cfg"] == DPPOConfig(
        prompt_prune_rate=0.3, prompt_rate_control="fixed", completion_prune_rate=0.5, prompt_policy="uniform",
        q_min=0.2, p_min=0.05, seed=7,
    )  # fmt: skip
    run = seen["run"]
    assert (run.run_dir, run.max_steps, run.schedule_steps, run.argv) == ("/tmp/dppo_run", 12, 30, argv)


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--dppo.prompt_rate_control", "fixed", "--dppo.prompt_prune_rate", "0"], True),
        ([], False),  # the defaults: zero-share from 0.5
        (["--dppo.prompt_rate_control", "fixed", "--dppo.prompt_prune_rate", "0", "--dppo.completion_prune_rate",
          "0.5"], False),
        (["--dppo.method", "grpo", "--dppo.prompt_rate_control", "fixed", "--dppo.prompt_prune_rate", "0"], False),
    ],
)  # fmt: skip
def test_settings_that_prune_nothing_say_so_at_start(capsys, flags, says):
    parse(GRPO + flags)
    assert ("prunes no prompt and no completion" in capsys.readouterr().out) is says
