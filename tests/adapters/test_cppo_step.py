"""One CPPO controller step (``--dppo.method cppo``) without Ray: the real samples generator, CPPO's
experience maker, the packed plan and the per-rank replay buffers. The step's accounting identity
(``step.check_accounting``, run by ``train_step``) holds with the pruned completions counted where the
mask is drawn; what is trained is the kept half at weight 1."""

import pytest
from dppo_pipeline import controller, one_step

from openrlhf_dppo.core import DPPOConfig

pytestmark = pytest.mark.usefixtures("stand_in_ray")


@pytest.mark.parametrize("dp", [1, 2])
def test_a_cppo_step_trains_the_kept_half_at_weight_one_and_its_accounting_holds(tmp_path, dp):
    # B = 3 at P = 0.5: 6 prompts drawn and rolled out, 24 completions, 2 of each group of 4 kept: 12,
    # one train batch of 8 (the rest of the kept set trains in the same step: DPPO's plan)
    t = controller(tmp_path, DPPOConfig(method="cppo", completion_prune_rate=0.5), dp=dp, batch=3)
    status, samples = one_step(t)  # train_step checks the accounting identity
    assert len(samples) == 24 and {d.q for d in samples.ctx.prompts.values()} == {1.0}
    assert (status["prompts/drawn"], status["prompts/rolled_out"], status["prompts/pruned"]) == (6, 6, 0)
    assert status["samples/generated"] == 24 and status["samples/pruned"] == 12
    assert status["samples/trained"] == 12 and status["samples/untrained"] == 0
    assert status["tokens/trained"] == status["tokens/generated"] - status["tokens/pruned"]
    assert status["dppo/weight_mean"] == status["dppo/weight_max"] == 1.0
    assert (
        status["dppo/normalizer_seqs"] == 12 and status["dppo/normalizer_tokens"] == status["tokens/trained"]
    )
    assert status["dppo/optimizer_steps"] == 1.0
    assert t.experience_maker.history is None and t.samples_generator.history is None
