"""ZeRO-3 gathers of several parameters at once on gloo (``devices.patch_zero3_gather``).

DeepSpeed's ``Init._allgather_params_coalesced`` launches one asynchronous all-gather per parameter and
waits for the last handle only; gloo runs asynchronous work on a pool of threads, so an earlier, larger
gather can still be in flight when its parameter is read. The patch sends the coalesced call to
``_allgather_params_sequential`` (one blocking all-gather per parameter).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PP = "deepspeed.runtime.zero.partition_parameters"

# the Linear layers (in, out) of the two-rank model: large ones first, tiny ones last, so the one handle
# the unpatched coalesced gather waits on belongs to a small, quick gather
LAYERS = [(768, 512), (512, 768), (768, 640), (640, 384), (384, 512), (512, 256)]
LAYERS += [(256, 64), (64, 32), (32, 16), (16, 8), (8, 4), (4, 2)]
ROUNDS = 20


@pytest.fixture
def partition_parameters(monkeypatch):
    """The DeepSpeed module, with ``Init._allgather_params_coalesced`` put back after the test."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    import importlib

    module = importlib.import_module(PP)
    # setattr on the class so that monkeypatch restores DeepSpeed's method (the patch replaces it
    # process-wide); the original is unmarked, so the patch below wraps it
    original = module.Init.__dict__["_allgather_params_coalesced"]
    assert not getattr(original, "_openrlhf_dppo_cpu", False)
    monkeypatch.setattr(module.Init, "_allgather_params_coalesced", original)
    return module


class _StandIn:
    def __init__(self):
        self.calls = []

    def _allgather_params_sequential(self, param_list, hierarchy=0):
        self.calls.append((param_list, hierarchy))
        return ("sequential", len(self.calls))


@pytest.mark.parametrize("quantize", [False, True])
def test_coalesced_gather_goes_through_the_sequential_one(partition_parameters, quantize):
    from openrlhf_dppo.compat.cpu import devices

    devices.patch_zero3_gather()
    patched = partition_parameters.Init._allgather_params_coalesced
    assert patched._openrlhf_dppo_cpu
    devices.patch_zero3_gather()  # idempotent: the wrapper is not wrapped again
    assert partition_parameters.Init._allgather_params_coalesced is patched

    stand_in, params = _StandIn(), [object(), object()]
    got = partition_parameters.Init._allgather_params_coalesced(stand_in, params, 0, quantize=quantize)
    assert got == ("sequential", 1)
    assert stand_in.calls == [(params, 0)]
    got = partition_parameters.Init._allgather_params_coalesced(stand_in, params, hierarchy=3)
    assert got == ("sequential", 2)
    assert stand_in.calls[-1] == (params, 3)


def _rank_main(rank: int, port: int) -> None:
    """One rank of the two-rank check (run as a script in a fresh interpreter): prints a JSON line."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    import deepspeed
    from deepspeed.runtime.zero import partition_parameters

    from openrlhf_dppo.compat.cpu import devices

    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(1234)  # the same draws on both ranks
    config = {"train_batch_size": 2, "zero_optimization": {"stage": 3}}
    with deepspeed.zero.Init(config_dict_or_path=config, dtype=torch.float32):
        model = torch.nn.Sequential(*(torch.nn.Linear(i, o) for i, o in LAYERS))
    params = list(model.parameters())
    assert all(p.ds_tensor.numel() < p.ds_numel for p in params), "parameters are not partitioned"

    def mismatches():
        bad = 0
        for _ in range(ROUNDS):
            with deepspeed.zero.GatheredParameters(params):  # one coalesced gather of all parameters
                together = [p.data.clone() for p in params]
            for p, t in zip(params, together):
                with deepspeed.zero.GatheredParameters([p]):  # a lone parameter: the blocking path
                    bad += int(not torch.equal(p.data, t))
        return bad

    unpatched = mismatches()
    devices.patch_zero3_gather()
    assert partition_parameters.Init._allgather_params_coalesced._openrlhf_dppo_cpu
    patched = mismatches()
    dist.barrier()
    dist.destroy_process_group()
    print(
        json.dumps(
            {"rank": rank, "unpatched": unpatched, "patched": patched, "compared": ROUNDS * len(params)}
        )
    )


def test_two_rank_gather_of_all_parameters_matches_gathers_one_by_one(free_port):
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")
    }
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port),
        WORLD_SIZE="2",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    # fresh interpreters (spawn-like): under pytest's importlib mode this module has no importable name,
    # so each rank runs this file as a script
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, str(rank), str(free_port)],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for rank in range(2)
    ]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-4000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r in results:
        print(f"rank {r['rank']}: unpatched coalesced gather differed {r['unpatched']}/{r['compared']} times")
    assert [r["patched"] for r in results] == [0, 0], results


if __name__ == "__main__":
    _rank_main(int(sys.argv[1]), int(sys.argv[2]))
