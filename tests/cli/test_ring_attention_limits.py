"""A sequence is measured against a micro-batch's capacity as DPPO's packer and OpenRLHF count it:
``--train.max_tokens_per_gpu`` x ``--ds.ring_attn_size`` x ``--ds.tensor_parallel_size``
(``core.micro_batch_capacity``), not against the per-GPU budget alone. A longer one is accepted, as
OpenRLHF accepts it (a micro-batch of its own), and the start-up says so."""

import pytest
from cli_commands import local_command, replaced, run_cli


def _ring(argv, size: int, max_len: int):
    """``argv`` on 2 actor GPUs, one ring-attention group of ``size`` of them, rollouts up to ``max_len``
    tokens (the local command's budget is 128 tokens per GPU)."""
    argv = replaced(replaced(argv, "--actor.num_gpus_per_node", "2"), "--data.max_len", str(max_len))
    return argv + ["--ds.ring_attn_size", str(size)]


def test_a_rollout_longer_than_one_gpus_budget_is_accepted_when_a_ring_of_two_shares_it(tmp_path):
    # 192 > 128 tokens per GPU, but a ring of 2 splits a sequence over 2 GPUs: 2 x 128 = 256 >= 192
    proc, ray_imported = run_cli(_ring(local_command(tmp_path), 2, 192), tmp_path)
    assert ray_imported, proc.stderr[-3000:]


def test_a_rollout_longer_than_the_rings_capacity_is_accepted_with_a_start_up_line_naming_the_flags(tmp_path):
    # 257 > 2 x 128: OpenRLHF trains such a rollout in a micro-batch of its own, and so does DPPO
    proc, ray_imported = run_cli(_ring(local_command(tmp_path), 2, 257), tmp_path)
    assert ray_imported, proc.stderr[-3000:]
    said = "--data.max_len 257 exceeds a micro-batch's 256 tokens"
    lines = [ln for ln in proc.stdout.splitlines() if said in ln]
    assert len(lines) == 1 and "trains in a micro-batch of its own" in lines[0], proc.stdout[-3000:]
    for flag in ("--train.max_tokens_per_gpu 128", "--ds.ring_attn_size 2", "--ds.tensor_parallel_size 1"):
        assert flag in lines[0], lines[0]


def test_the_start_up_line_is_dppos_and_only_past_the_capacity():
    from openrlhf_dppo.cli.validate import limit_notices

    flags = {"data.max_len": 256, "train.max_tokens_per_gpu": 128, "ds.ring_attn_size": 2,
             "ds.tensor_parallel_size": 1}  # fmt: skip
    assert limit_notices(flags, dppo=True) == []  # 256 fits 2 x 128
    assert limit_notices({**flags, "data.max_len": 257}, dppo=False) == []  # the GRPO arm: OpenRLHF's own
    assert len(limit_notices({**flags, "data.max_len": 257}, dppo=True)) == 1


@pytest.mark.parametrize("budget,ring,tp", [(128, 1, 1), (128, 2, 1), (100, 2, 3), (7, 4, 2)])
def test_the_capacity_is_the_one_openrlhf_counts_micro_batches_with(budget, ring, tp):
    from openrlhf.utils.seqlen_balancing import get_minimum_num_micro_batch_size

    from openrlhf_dppo.core import micro_batch_capacity

    cap = micro_batch_capacity(budget, ring, tp)
    # the host's first fit puts cap - 1 and 1 token into one micro-batch and cap and 1 into two: only
    # a capacity of exactly cap does both
    assert get_minimum_num_micro_batch_size([cap - 1, 1], budget, ring, tp) == 1
    assert get_minimum_num_micro_batch_size([cap, 1], budget, ring, tp) == 2
