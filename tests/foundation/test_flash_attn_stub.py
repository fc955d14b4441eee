"""The pure-torch flash-attn stand-in against straightforward references."""

import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import openrlhf_dppo  # noqa: F401  (installs the stand-in when flash_attn is missing)
from openrlhf_dppo.compat import flash_attn_stub

pytestmark = pytest.mark.skipif(
    flash_attn_stub.real_flash_attn_available(),
    reason="a real flash-attn is installed; the stand-in is unused",
)


def test_stand_in_is_what_flash_attn_resolves_to():
    import flash_attn
    from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input  # noqa: F401
    from flash_attn.utils.distributed import all_gather  # noqa: F401

    assert getattr(flash_attn, "IS_OPENRLHF_DPPO_STUB", False)
    assert flash_attn_stub.STUB_PATH in sys.path
    assert flash_attn_stub.STUB_PATH in os.environ["PYTHONPATH"].split(os.pathsep)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unpad_pad_round_trip(seed):
    from flash_attn.bert_padding import pad_input, unpad_input

    g = torch.Generator().manual_seed(seed)
    b, s, h = 4, 7, 3
    lengths = torch.randint(0, s + 1, (b,), generator=g)
    mask = (torch.arange(s)[None, :] < lengths[:, None]).long()
    x = torch.randn(b, s, h, generator=g)

    unpadded, indices, cu_seqlens, max_len, seqused = unpad_input(x, mask)

    # reference: walk the rows and keep the real tokens in order
    ref_rows = [x[i, j] for i in range(b) for j in range(s) if mask[i, j]]
    ref = torch.stack(ref_rows) if ref_rows else x.new_zeros(0, h)
    torch.testing.assert_close(unpadded, ref, rtol=0, atol=0)
    assert cu_seqlens.tolist() == [0] + torch.cumsum(lengths, 0).tolist()
    assert cu_seqlens.dtype == torch.int32 and seqused.dtype == torch.int32
    assert max_len == int(lengths.max())
    assert seqused.tolist() == lengths.tolist()
    assert indices.tolist() == [i * s + j for i in range(b) for j in range(s) if mask[i, j]]

    back = pad_input(unpadded, indices, b, s)
    torch.testing.assert_close(back, x * mask[..., None], rtol=0, atol=0)


def test_unpad_with_unused_mask_keeps_allocated_tokens_but_counts_only_attended():
    from flash_attn.bert_padding import unpad_input

    # row 0: 2 attended + 1 allocated-unused token; row 1: 1 attended
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]])
    x = torch.arange(8.0).reshape(2, 4, 1)
    out, indices, cu, max_len, seqused = unpad_input(x, mask, unused)
    assert indices.tolist() == [0, 1, 2, 4]
    assert cu.tolist() == [0, 3, 4] and max_len == 3 and seqused.tolist() == [2, 1]
    assert out.flatten().tolist() == [0.0, 1.0, 2.0, 4.0]


def test_index_first_axis_gradient_is_a_scatter_add():
    from flash_attn.bert_padding import index_first_axis

    x = torch.randn(6, 2, 3, requires_grad=True)
    idx = torch.tensor([4, 0, 4, 2])  # a repeated index must accumulate
    up = torch.randn(4, 2, 3)
    (index_first_axis(x, idx) * up).sum().backward()

    expected = torch.zeros(6, 2, 3)
    for k, i in enumerate(idx.tolist()):
        expected[i] += up[k]
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=1e-6)


def test_rearrange_is_exported():
    from flash_attn.bert_padding import rearrange

    assert rearrange(torch.zeros(2, 3, 4), "b s ... -> (b s) ...").shape == (6, 4)


def _all_gather_worker(rank, world, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from flash_attn.utils.distributed import all_gather

    x = torch.full((2, 3), float(rank + 1), requires_grad=True)
    y = all_gather(x, None)
    # loss weights each gathered row by (row index + 1): rank r's rows sit at 2r, 2r+1 and every rank
    # computes the same loss, so the gradient reaching rank r is world * (2r+1 | 2r+2) per element.
    w = torch.arange(1, y.shape[0] + 1, dtype=torch.float32)[:, None].expand_as(y)
    (y * w).sum().backward()
    results[rank] = (y.detach().tolist(), x.grad.tolist())
    dist.destroy_process_group()


def test_all_gather_forward_and_backward_on_two_gloo_ranks(free_port):
    import openrlhf_dppo  # noqa: F401,F811

    port = free_port
    world = 2
    # fork, not spawn: under pytest's importlib mode this test module has no importable name
    ctx = mp.get_context("fork")
    results = ctx.Manager().dict()
    procs = [ctx.Process(target=_all_gather_worker, args=(r, world, port, results)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    for rank in range(world):
        y, grad = results[rank]
        assert y == [[1.0] * 3, [1.0] * 3, [2.0] * 3, [2.0] * 3]
        assert grad == [[float(world * (2 * rank + 1))] * 3, [float(world * (2 * rank + 2))] * 3]
