"""What ``--dppo.prompt_batch refill`` gives, as its flag help, its validation message and docs/FLAGS.md
state it (``DPPOConfig.prompts_drawn``): floor(B / (1 - r_q)) prompts drawn per step; every kept one
rolled out in that step -- all of them while they are unseen (epoch 1), about B once the history knows
them; and always GRPO's number of optimizer steps, each normalised by the full drawn batch."""

import pytest
from dppo_pipeline import controller, one_step

from openrlhf_dppo.adapters.dispatch import PLAN_SEQS
from openrlhf_dppo.core import DPPOConfig

pytestmark = pytest.mark.usefixtures("stand_in_ray")


def test_refill_rolls_out_whole_draws_in_epoch_1_then_about_b_always_in_grpos_optimizer_steps(tmp_path):
    # B = 6 prompts, G = 4, --train.batch_size 8: GRPO takes 6 x 4 // 8 = 3 optimizer steps per step.
    # refill at r_q = 0.5 draws floor(6 / 0.5) = 12 of the 24 prompts: epoch 1 is two steps of 12 unseen
    # prompts (q = 1: all rolled out); in epoch 2 every prompt has a history and systematic sampling keeps
    # round(sum q) = round(12 x 0.5) = 6, within one.
    cfg = DPPOConfig(
        prompt_prune_rate=0.5, completion_prune_rate=0.5, q_min=0.1, prompt_batch="refill", seed=3
    )
    assert cfg.prompts_drawn(6) == 12 and DPPOConfig(prompt_prune_rate=0.5).prompts_drawn(6) == 6
    t = controller(tmp_path, cfg, batch=6, n_prompts=24)
    plans = []
    make = t.experience_maker.make_experience_batch  # the plan rides on what it returns

    def recording(rollouts):
        experiences = make(rollouts)
        plans.append(experiences.plan)
        return experiences

    t.experience_maker.make_experience_batch = recording
    drawn, rolled_out = [], []
    for _ in range(4):
        status, _ = one_step(t)
        drawn.append(status["prompts/drawn"])
        rolled_out.append(status["prompts/rolled_out"])
    assert drawn == [12.0] * 4
    assert rolled_out[:2] == [12.0, 12.0]  # epoch 1: the whole draw, 2 x --rollout.batch_size
    assert all(abs(r - 6) <= 1 for r in rolled_out[2:]), rolled_out  # epoch 2: about B
    assert [p.num_steps for p in plans] == [3] * 4  # GRPO's optimizer steps, whatever was drawn
    for plan in plans:  # each optimizer step's sequence normaliser: Z_seq / steps = 12 x 4 / 3
        assert {float(it.info[PLAN_SEQS]) for items in plan.rank_items for it in items} == {16.0}
