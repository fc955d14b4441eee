"""The rules every adapter shares (``adapters.step``): the accounting identity, the LR schedule's length
(OpenRLHF's count, the short batches' steps, --dppo.max_steps, --dppo.schedule_steps), and the scoped swap
of a host module global."""

from types import SimpleNamespace

import pytest
from dppo_pipeline import schedule_of
from dppo_stand_ins import base_argv, make_args

from openrlhf_dppo.adapters.step import (
    AccountingError,
    check_accounting,
    cppo_steps,
    planned_steps,
    scheduler_steps,
    swap_attr,
)
from openrlhf_dppo.core import DPPOConfig
from openrlhf_dppo.core.config import DPPOConfigError
from openrlhf_dppo.run_dir import RunMeta


def test_accounting_check_raises_on_a_mismatch_or_a_missing_count():
    ok = {"tokens/generated": 12.0, "tokens/trained": 5.0, "tokens/pruned": 3.0, "tokens/filtered": 2.0}
    ok.update(
        {"samples/generated": 5.0, "samples/trained": 2.0, "samples/pruned": 1.0, "samples/filtered": 1.0}
    )
    ok.update({"tokens/untrained": 2.0, "samples/untrained": 1.0})  # held by the actors, never trained
    check_accounting(ok)
    with pytest.raises(AccountingError, match=r"tokens: generated 12.0 != trained 5.0 \+ pruned 2.0"):
        check_accounting({**ok, "tokens/pruned": 2.0})
    with pytest.raises(AccountingError, match="samples: no count of trained"):
        check_accounting({k: v for k, v in ok.items() if k != "samples/trained"})
    with pytest.raises(AccountingError, match="samples: no count of untrained"):
        check_accounting({k: v for k, v in ok.items() if k != "samples/untrained"})
    with pytest.raises(AccountingError, match=r"samples: generated 5.0 != .* untrained 0.0"):
        check_accounting({**ok, "samples/untrained": 0.0})


def test_the_lr_schedule_spans_the_steps_max_steps_allows():
    args = make_args(base_argv(batch=4, group=4, train_batch=8) + ["--train.max_epochs", "2"])
    assert scheduler_steps(args, 1000, None) == 1000
    assert scheduler_steps(args, 1000, 7) == 7 * (4 * 4 // 8) * 2
    assert scheduler_steps(args, 10, 7) == 10


def test_schedule_steps_sets_the_span_of_a_run_cut_short():
    """--dppo.schedule_steps: a run stopped at max_steps follows the schedule of the longer run, even
    past what its episodes would allow (the span is that run's, not this one's)."""
    args = make_args(base_argv(batch=4, group=4, train_batch=8) + ["--train.max_epochs", "2"])
    assert scheduler_steps(args, 1000, 7, span=30) == 30 * (4 * 4 // 8) * 2
    assert scheduler_steps(args, 10, 7, span=30) == 30 * 2 * 2
    assert scheduler_steps(args, 120, None, span=30) == 120
    with pytest.raises(
        DPPOConfigError, match="--dppo.schedule_steps 30: must cover the run: 120 optimizer steps, fewer"
    ):
        scheduler_steps(args, 1000, None, span=30)  # all episodes, no --dppo.max_steps: 1000 steps


@pytest.mark.parametrize(
    "prompts, batch, train_batch, dp, rule, extra, limit, steps",
    [
        # B x G = 16 < 32: every rollout batch is short, each one step under train: 16 batches, 16 steps
        # (OpenRLHF's count is 64 x 4 // 32 = 8; past it the cosine climbs back to the peak)
        (64, 4, 32, 1, "train", (), None, 16),
        (64, 4, 32, 1, "train", ("--train.num_episodes", "2", "--train.max_epochs", "2"), None, 64),
        (64, 4, 32, 1, "train", (), 10, 10),  # the steps --dppo.max_steps allows
        # 22 prompts in batches of 6, 6, 6, 4 x G = 4, each smaller than 32: 4 steps (OpenRLHF's count: 2)
        (22, 6, 32, 1, "train", (), None, 4),
        # 65 prompts: 16 batches of 4 x 4 = 16 rollouts and a last one of 4, fewer than the 8 ranks (no step)
        (65, 4, 32, 8, "train", (), None, 16),
        # a short last batch only (6, 6, 6, 3 prompts x 4, train batch 16): OpenRLHF's 84 // 16 = 5 already
        # covers the 4 steps made, and stays
        (21, 6, 16, 1, "train", (), None, 5),
        # drop: whole train batches only, never more than OpenRLHF's count (11 = 3 + 3 + 3 + 2 made; 5 > 4)
        (22, 6, 8, 1, "drop", (), None, 11),
        (22, 6, 16, 1, "drop", (), None, 5),
    ],
)
def test_the_lr_schedule_spans_every_optimizer_step_the_run_makes(
    prompts, batch, train_batch, dp, rule, extra, limit, steps
):
    short = ["--dppo.short_batch", rule]  # the validation refuses B x G < train batch under drop
    args = make_args(base_argv(dp=dp, batch=batch, group=4, train_batch=train_batch) + short + list(extra))
    assert schedule_of(args, prompts, rule, limit) == steps


def test_swap_attr_restores_a_module_global_and_removes_an_instance_attribute_that_shadowed_a_method():
    host = SimpleNamespace(balance=lambda: "host")
    with swap_attr(host, "balance", lambda: "planned") as previous:
        assert host.balance() == "planned" and previous() == "host"
    assert host.balance() == "host"

    class Trainer:
        def fit(self):
            return "class"

    t = Trainer()
    with swap_attr(t, "fit", lambda: "swapped"):
        assert t.fit() == "swapped"
    assert "fit" not in vars(t) and t.fit() == "class"
    with pytest.raises(RuntimeError), swap_attr(host, "balance", None):
        raise RuntimeError("the step failed")
    assert host.balance() == "host"


@pytest.mark.parametrize(
    "prompts,rule,expected",
    [
        (24, "drop", 3),  # 3 draws of 8 prompts, 2 kept a group of 4: 16 completions, one batch of 16 each
        (20, "drop", 2),  # the short last draw of 4 prompts keeps 8: less than a batch, not trained
        (20, "train", 3),  # ... or one step of its own under --dppo.short_batch train
    ],
)
def test_cppos_planned_steps_count_an_epoch_by_its_larger_draw(prompts, rule, expected):
    """--dppo.method cppo at P = 0.5: int(B / (1 - P)) = 8 prompts a step, G - int(G P) = 2 kept of each
    group, the kept completions' whole train batches; GRPO's count of the same epoch is 24 x 4 // 16 = 6."""
    args = make_args(base_argv(batch=4, group=4, train_batch=16))
    cfg = DPPOConfig(method="cppo", completion_prune_rate=0.5, short_batch=rule)
    assert cppo_steps(args, prompts, cfg) == (expected, 1)
    host = prompts * 4 // 16  # OpenRLHF's count, replaced under CPPO
    assert planned_steps(args, host, prompts, cfg, RunMeta()) == expected
    assert planned_steps(args, host, prompts, cfg, RunMeta(max_steps=2)) == 2  # one optimizer step a step
    assert planned_steps(args, host, prompts, cfg, RunMeta(max_steps=1, schedule_steps=5)) == 5
