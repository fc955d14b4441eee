"""CPU-layer tests: each starts from an environment without the CPU layer's variables, so a developer's
shell (say ``OPENRLHF_DPPO_CPU_DISABLE`` left set) cannot change what they check."""

import pytest

from openrlhf_dppo import precision
from openrlhf_dppo.compat import cpu

CPU_ENV = (
    cpu.ENV_DISABLE,
    cpu.ENV_ACTIVE,
    cpu.hooks.ENV_VERIFY,
    cpu.hooks.ENV_HEARTBEAT,
    cpu.hooks.ENV_SYNC_TIMEOUT,
    cpu.hooks.ENV_WATCHDOG,
    cpu.hooks.ENV_DEVICE,
    "RAY_ADDRESS",
)


@pytest.fixture(autouse=True)
def clean_cpu_env(monkeypatch):
    for name in CPU_ENV:
        monkeypatch.delenv(name, raising=False)
    for name in precision.INDUCTOR_ENV:  # recorded even when unset: apply() sets them for good
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
