"""``--train.async_enable``: accepted in both arms, as OpenRLHF parses it; the host seams
``adapters.async_trainer`` relies on are still there (the second test reads the host's source and fails
when another OpenRLHF moves one of them, so the adapter is revisited rather than left broken).
OpenRLHF's own async example is in the parity test (tests/cli/test_openrlhf_example_parity.py).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest
from cli_commands import local_command
from openrlhf_examples import flat, openrlhf_parse

from openrlhf_dppo.cli import train_dppo_ray as cli

ASYNC_FLAGS = [
    ["--train.async_enable"],
    ["--train.async_enable", "--train.partial_rollout_enable"],
    ["--train.async_enable", "--train.async_queue_size", "3"],
]


@pytest.mark.parametrize("arm", [[], ["--dppo.method", "grpo"]], ids=["dppo", "baseline"])
@pytest.mark.parametrize("flags", ASYNC_FLAGS, ids=["async", "partial-rollout", "queue-3"])
def test_both_arms_take_the_async_trainer_as_openrlhf_parses_it(arm, flags, tmp_path):
    argv = local_command(tmp_path) + flags
    host = flat(openrlhf_parse(argv))
    called = []
    cli.main(argv + arm, train_fn=called.append, check_inputs=True)
    (args,) = called
    ours = flat(args)
    for key in ("train.async_enable", "train.partial_rollout_enable", "train.async_queue_size"):
        assert ours[key] == host[key], key
    assert ours["dppo.method"] == ("dppo" if arm == [] else "grpo")


def _host_tree(relative: str) -> ast.Module:
    spec = importlib.util.find_spec("openrlhf")  # the package's location only: nothing is imported
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return ast.parse(path.read_text(encoding="utf-8"))


def _top(tree: ast.Module, name: str):
    return next(n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name)


def test_the_host_seams_the_async_adapter_uses_are_still_there():
    from openrlhf.trainer import ppo_trainer_async as host

    from openrlhf_dppo.adapters.step import unwrap_actor_class

    # train() imports PPOTrainerAsync from its module when it runs: install()'s module attribute is read
    train = _top(_host_tree("cli/train_ppo_ray.py"), "train")
    local = [n for n in ast.walk(train) if isinstance(n, ast.ImportFrom)]
    assert any(
        n.module == "openrlhf.trainer.ppo_trainer_async" and [a.name for a in n.names] == ["PPOTrainerAsync"]
        for n in local
    )
    generator, training, controller = (
        unwrap_actor_class(c) for c in (host.GenerateSamplesActor, host.TrainingActor, host.PPOTrainerAsync)
    )
    # the constructor keywords the DPPO actors pass on, and the methods they call or override
    for cls, keywords in (
        (generator, {"pretrain", "strategy", "vllm_engines", "vllm_lock", "rollout_queue", "rollout_slots"}),
        (training, {"pretrain", "strategy", "actor_model_group", "critic_model_group", "reward_model_group",
                    "reference_model_group", "vllm_engines", "vllm_lock", "rollout_queue", "rollout_slots"}),
    ):  # fmt: skip
        assert keywords <= set(inspect.signature(cls.__init__).parameters), cls
    for name in ("_should_eval", "_run_eval", "get_max_steps", "fit"):
        assert callable(getattr(generator, name)), name
    assert callable(training.broadcast_to_vllm) and callable(training.train_step)
    assert callable(controller.get_max_steps) and callable(host.VLLMLock.remote)
    # the generator's state attributes the DPPO generator reads (set in OpenRLHF's __init__)
    init = _top(_host_tree("trainer/ppo_trainer_async.py"), "GenerateSamplesActor")
    assigned = {ast.unparse(t) for n in ast.walk(init) if isinstance(n, ast.Assign) for t in n.targets}
    for attr in ("(self.prompts_dataloader, self.eval_dataloader, self.max_steps)", "self.samples_generator",
                 "self.vllm_lock", "self._partial_rollout", "self.rollout_queue", "self.rollout_slots",
                 "self._last_eval_step", "self.generate_kwargs"):  # fmt: skip
        assert attr in assigned, attr
