"""``--train.async_enable``: refused in both arms, naming the seams OpenRLHF 0.11.2's async trainer lacks.

docs/FLAGS.md ("Async") gives the reasons; the second test reads the host's source and fails when one of
them no longer holds (another OpenRLHF), so the refusal is revisited rather than left stale.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from cli_commands import local_command
from openrlhf_examples import flat, openrlhf_parse

from openrlhf_dppo.cli import train_dppo_ray as cli

SEAMS = (
    "--train.async_enable: not supported by train_dppo_ray, with DPPO or --dppo.enable false",
    "OpenRLHF 0.11.2's async trainer leaves no seam",
    "train() imports PPOTrainerAsync inside itself",
    "GenerateSamplesActor builds SamplesGenerator by its module-level name in its own Ray actor process",
    "TrainingActor whose experience maker updates the prompt history",
    "ray Queue",
    "PPOTrainerAsync.fit restores only the dataloader state into the generator",
    "would run OpenRLHF's async trainer, not this baseline",
    "A host change would need",
)


@pytest.mark.parametrize("arm", [[], ["--dppo.enable", "false"]], ids=["dppo", "baseline"])
def test_async_is_refused_in_both_arms_naming_the_missing_seams(arm, tmp_path, capsys):
    argv = local_command(tmp_path) + ["--train.async_enable"]
    assert flat(openrlhf_parse(argv))["train.async_enable"] is True  # OpenRLHF itself takes the command
    called = []
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + arm, train_fn=called.append, check_inputs=True)
    err = " ".join(capsys.readouterr().err.split())
    assert exc.value.code == 2 and not called
    for part in SEAMS:
        assert part in err, part
    flags_md = " ".join((Path(__file__).resolve().parents[2] / "docs" / "FLAGS.md").read_text().split())
    assert (
        "OpenRLHF 0.11.2's async trainer (`openrlhf/trainer/ppo_trainer_async.py`) leaves no seam" in flags_md
    )


def _host_tree(relative: str) -> ast.Module:
    spec = importlib.util.find_spec("openrlhf")  # the package's location only: nothing is imported
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return ast.parse(path.read_text(encoding="utf-8"))


def _top(tree: ast.Module, name: str):
    return next(n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _calls(node: ast.AST) -> list[str]:
    return [ast.unparse(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)]


def test_the_host_still_lacks_the_seams_the_refusal_names():
    train = _top(_host_tree("cli/train_ppo_ray.py"), "train")
    # imported inside train(): not the name install() replaces
    local = [n for n in ast.walk(train) if isinstance(n, ast.ImportFrom)]
    assert any(
        n.module == "openrlhf.trainer.ppo_trainer_async" and [a.name for a in n.names] == ["PPOTrainerAsync"]
        for n in local
    )

    tree = _host_tree("trainer/ppo_trainer_async.py")
    generator, training, trainer = (
        _top(tree, n) for n in ("GenerateSamplesActor", "TrainingActor", "PPOTrainerAsync")
    )
    # the generator builds SamplesGenerator by its module-level name, in its own Ray actor
    assert "SamplesGenerator" in _calls(_method(generator, "__init__"))
    # all three are Ray actors: the two are built inside PPOTrainerAsync's own actor process
    for cls in (generator, training, trainer):
        assert [ast.unparse(d) for d in cls.decorator_list] == ["ray.remote"], cls.name
    # the trainer side is its own BasePPOTrainer subclass with its own fit loop
    assert [ast.unparse(b) for b in training.bases] == ["BasePPOTrainer"]
    assert _method(training, "fit") is not None
    # both actors are built by name with fixed arguments; they share only ray Queues
    init = _calls(_method(trainer, "__init__"))
    assert {"GenerateSamplesActor.remote", "TrainingActor.remote", "Queue"} <= set(init)
    assert any(isinstance(n, ast.ImportFrom) and n.module == "ray.util.queue" for n in tree.body)
    # on resume the generator gets the dataloader state back, nothing else
    fit = _method(trainer, "fit")
    to_generator = [c for c in _calls(fit) if c.startswith("self.generator_actor.")]
    assert sorted(set(to_generator)) == [
        "self.generator_actor.fit.remote",
        "self.generator_actor.load_state_dict.remote",
    ]
    assert (
        "self.generator_actor.load_state_dict.remote(checkpoint_states['data_loader_state_dict'])"
        in ast.unparse(fit)
    )
