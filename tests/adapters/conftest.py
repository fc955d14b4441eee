"""Adapter tests: make the stand-ins module importable (tests/ is not a package), import the package
first so that its flash-attn stand-in is in place before any OpenRLHF module loads, and stand in for
Ray's object transport where the host modules call it."""

import os
import sys

import pytest
import torch

import openrlhf_dppo  # noqa: F401

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def stand_in_ray(monkeypatch):
    """``ray.put/get/wait`` of OpenRLHF's trainer, experience maker and samples generator become plain
    pass-throughs (the stand-in actor groups and engines answer synchronously); the replay buffer's
    ``torch.cuda.current_device()`` names device 0 (a CPU tensor is never moved there)."""
    from dppo_stand_ins import FAKE_RAY
    from openrlhf.trainer import ppo_trainer
    from openrlhf.trainer.ppo_utils import experience_maker, samples_generator

    for module in (ppo_trainer, experience_maker, samples_generator):
        monkeypatch.setattr(module, "ray", FAKE_RAY)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


@pytest.fixture
def second_device(monkeypatch):
    """The device a GPU rank's micro-batches live on: ``cuda:0`` of the stand-in (``second_device.py``:
    CPU memory under CUDA's device rules) by default, the real GPU with ``DPPO_SECOND_DEVICE=cuda``
    (then a missing GPU fails the test: it is never skipped)."""
    want = os.environ.get("DPPO_SECOND_DEVICE", "stand-in")
    if want == "cuda":
        if not torch.cuda.is_available():
            pytest.fail("DPPO_SECOND_DEVICE=cuda, but torch sees no CUDA device")
        yield torch.device("cuda", torch.cuda.current_device())
        return
    if want != "stand-in":
        pytest.fail(f"DPPO_SECOND_DEVICE must be cuda or stand-in (the default), got {want!r}")
    from second_device import DEVICE, SecondDevice

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)  # ppo_train's target: the stand-in
    with SecondDevice():
        yield DEVICE
