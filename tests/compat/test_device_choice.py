"""Where the workers compute is decided for the run, not by the driver's torch alone: a driver without
CUDA that joins a cluster with GPUs applies no CPU patch, and a Ray worker that sees CUDA refuses the
CPU layer by name (``compat/cpu/device_choice.py``)."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest
import ray
import torch

from openrlhf_dppo import _host, precision
from openrlhf_dppo.compat import cpu
from openrlhf_dppo.compat.cpu import device_choice as dc
from openrlhf_dppo.compat.cpu.ray_init import ray_init_kwargs

# ray.nodes() records as Ray 2.55 writes them. A node whose GPUs Ray found on the hardware carries an
# "accelerator_type:<type>" resource; GPUs given by hand (`ray start --num-gpus 4` on a CPU node, as the
# Slurm launcher's CPU runs do) carry none (test_stand_in_gpus_of_this_cpu_machine_are_not_detected).
CPU_HEAD = {"Alive": True, "Resources": {"CPU": 4.0, "memory": 1e9}, "Labels": {}}
GPU_NODE = {"Alive": True, "Resources": {"CPU": 32.0, "GPU": 8.0, "accelerator_type:H200": 1.0}, "Labels": {}}
STAND_IN_NODE = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 4.0}, "Labels": {}}
ADDRESS = "10.0.0.1:6379"


def never_asked(address):
    raise AssertionError(f"the cluster at {address} was asked, but nothing needed asking")


def decide(env: dict, cuda: bool = False, nodes=None) -> dc.DeviceChoice:
    return dc.decide(
        env, cuda_available=lambda: cuda, ask_cluster=never_asked if nodes is None else lambda a: nodes
    )


# ---- the driver's decision ---------------------------------------------------------------------------
def test_a_driver_that_starts_its_own_ray_decides_from_its_own_cuda():
    assert decide({}).device == "cpu"
    assert decide({"RAY_ADDRESS": "local"}).device == "cpu"  # Ray's name for "start one here"
    assert decide({}, cuda=True).device == "cuda"
    assert decide({"RAY_ADDRESS": ADDRESS}, cuda=True).device == "cuda"  # nothing asked: it has CUDA


def test_a_driver_without_cuda_joining_a_cluster_asks_it_for_gpus_ray_detected():
    env = {"RAY_ADDRESS": ADDRESS}
    got = decide(env, nodes=[CPU_HEAD, GPU_NODE])
    assert got.device == "cuda" and got.why == f"the Ray cluster at {ADDRESS} has 8 GPUs that Ray detected"
    # the node label newer Ray versions write counts as detected too
    labelled = {"Alive": True, "Resources": {"GPU": 2.0}, "Labels": {dc.DETECTED_TYPE_LABEL: "A100"}}
    assert decide(env, nodes=[CPU_HEAD, labelled]).device == "cuda"
    # a GPU node that has left the cluster is no GPU of this run
    assert decide(env, nodes=[CPU_HEAD, {**GPU_NODE, "Alive": False}]).device == "cpu"
    assert decide(env, nodes=[CPU_HEAD]).device == "cpu"


def test_stand_in_gpus_of_a_cpu_cluster_keep_it_a_cpu_run():
    got = decide({"RAY_ADDRESS": ADDRESS}, nodes=[STAND_IN_NODE, STAND_IN_NODE])
    assert got.device == "cpu" and "(8 GPU resources given by hand, taken as stand-ins)" in got.why


def test_the_environment_decides_without_asking_and_is_refused_by_name_when_bad():
    env = {"RAY_ADDRESS": ADDRESS}
    assert decide({**env, dc.ENV_DEVICE: "cuda"}).device == "cuda"
    assert decide({**env, dc.ENV_DEVICE: " CPU "}).device == "cpu"
    assert decide({**env, dc.ENV_DEVICE: ""}, nodes=[GPU_NODE]).device == "cuda"  # empty is auto
    with pytest.raises(
        dc.DeviceChoiceError, match=r"^OPENRLHF_DPPO_DEVICE='gpu': expected one of auto, cpu, cuda$"
    ):
        decide({dc.ENV_DEVICE: "gpu"})
    # the CPU layer is never forced onto a driver that has CUDA
    with pytest.raises(
        dc.DeviceChoiceError, match=r"^OPENRLHF_DPPO_DEVICE=cpu, but this driver's torch sees CUDA"
    ):
        decide({dc.ENV_DEVICE: "cpu"}, cuda=True)


# ---- asking the cluster: a child process, with a timeout -----------------------------------------------
_STAND_IN_RAY = '''"""Stands in for Ray in the child that asks the cluster."""
import json, os, time
def is_initialized():
    return False
def init(address=None, **kwargs):
    {init}
def nodes():
    return json.loads(os.environ["DPPO_TEST_NODES"])
'''


@pytest.fixture
def listening():
    """An address where something accepts TCP connections (and says nothing): the TCP check passes."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


def stand_in_ray(monkeypatch, tmp_path, init: str, nodes=()) -> None:
    """The child's ``import ray`` finds a stand-in whose ``init`` runs ``init`` (one statement)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(_STAND_IN_RAY.format(init=init))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("DPPO_TEST_NODES", json.dumps(list(nodes)))


def test_the_cluster_is_asked_by_a_child_process_and_this_one_never_connects(
    monkeypatch, tmp_path, listening
):
    stand_in_ray(monkeypatch, tmp_path, "pass", nodes=[CPU_HEAD, GPU_NODE])
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("the driver itself connected to the cluster"))
    assert dc.cluster_nodes(listening) == [CPU_HEAD, GPU_NODE]
    got = dc.decide({"RAY_ADDRESS": listening}, cuda_available=lambda: False)
    assert got.device == "cuda" and got.why == f"the Ray cluster at {listening} has 8 GPUs that Ray detected"


def test_a_cluster_that_cannot_be_asked_is_named_with_the_way_out(monkeypatch, tmp_path, listening):
    stand_in_ray(monkeypatch, tmp_path, 'raise ConnectionError("no GCS at " + address)')
    with pytest.raises(dc.DeviceChoiceError) as err:
        dc.decide({"RAY_ADDRESS": listening}, cuda_available=lambda: False)
    assert str(err.value) == (
        f"RAY_ADDRESS='{listening}': could not ask the Ray cluster whether it has GPUs (ConnectionError: no "
        f"GCS at {listening}); set OPENRLHF_DPPO_DEVICE=cuda or OPENRLHF_DPPO_DEVICE=cpu to decide without asking"
    )


def test_an_address_where_nothing_listens_is_refused_at_once_naming_it(free_port):
    address = f"127.0.0.1:{free_port}"
    with pytest.raises(dc.DeviceChoiceError) as err:
        dc.cluster_nodes(address)
    message = str(err.value)
    assert message.startswith(
        f"RAY_ADDRESS='{address}': could not ask the Ray cluster whether it has GPUs (nothing answers at {address}: "
    )
    assert message.endswith(
        "set OPENRLHF_DPPO_DEVICE=cuda or OPENRLHF_DPPO_DEVICE=cpu to decide without asking"
    )


def test_a_cluster_that_does_not_answer_is_given_up_after_the_timeout(monkeypatch, tmp_path, listening):
    # Ray's own connection retries for minutes (an unreachable GCS: still retrying at 120 s); the child
    # that asks is killed at the timeout, with whatever it started
    stand_in_ray(monkeypatch, tmp_path, "time.sleep(600)")
    with pytest.raises(dc.DeviceChoiceError) as err:
        dc.cluster_nodes(listening, timeout_s=3)
    assert (
        f"RAY_ADDRESS='{listening}': could not ask the Ray cluster whether it has GPUs (no answer within 3 s"
        in str(err.value)
    )
    assert dc.ASK_TIMEOUT_S <= 120  # the default: a clear error within two minutes, never a hang


def test_the_address_forms_ray_takes():
    assert dc._host_port("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert dc._host_port("ray://head:10001") == ("head", 10001)
    assert dc._host_port("[::1]:6379") == ("::1", 6379)
    assert dc._host_port("auto") is None  # Ray finds the address itself: no TCP check, the child asks


def test_stand_in_gpus_of_this_cpu_machine_are_not_detected(monkeypatch):
    # real Ray: what this machine's node says about GPUs given by hand, the premise of the rule above, and
    # the same records as the child process that asks a cluster reads them from its GCS
    if torch.cuda.is_available():
        pytest.fail("this test needs a machine without CUDA (its GPUs would be detected)")
    # a driver's ray.init installs Ray's own SIGTERM / SIGINT handlers in this process, and shutdown
    # leaves them: put the test process's back, so that later tests see their own signal handling
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    ray.init(address="local", num_cpus=1, num_gpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        nodes = ray.nodes()
        address = ray.get_runtime_context().gcs_address
        with monkeypatch.context() as m:
            m.setattr(ray, "is_initialized", lambda: False)  # as a driver that has not connected
            asked = dc.cluster_nodes(address)
    finally:
        ray.shutdown()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert [n["Resources"].get("GPU") for n in nodes] == [2.0]
    assert dc.detected_gpus(nodes) == 0
    assert asked == [{k: n[k] for k in ("Alive", "Resources", "Labels")} for n in nodes]


# ---- the driver: cpu.apply and the command line -------------------------------------------------------
@pytest.fixture
def fake_cluster(monkeypatch):
    """A driver without CUDA, RAY_ADDRESS set, and the cluster's answer replaced: returns (set nodes, the
    addresses asked)."""
    calls: list[str] = []
    state = {"nodes": []}

    def ask(address, timeout_s=dc.ASK_TIMEOUT_S):
        calls.append(address)
        return list(state["nodes"])

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("RAY_ADDRESS", ADDRESS)
    monkeypatch.setattr(dc, "cluster_nodes", ask)
    return lambda nodes: state.update(nodes=nodes), calls


@pytest.fixture
def recorded_apply(monkeypatch):
    """cpu.apply's installers replaced by recorders; the environment it writes restored afterwards."""
    installed: list[str] = []
    for name in (cpu.ENV_ACTIVE, cpu.ENV_DISABLE, "VLLM_CPU_KVCACHE_SPACE", "TOKENIZERS_PARALLELISM",
                 precision.ENV, precision.INDUCTOR_CACHE):  # fmt: skip
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)  # both recorded: the value from before the test comes back
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(cpu, "install", lambda site: installed.append(site) or [])
    monkeypatch.setattr(cpu, "wrap_ray_init", lambda *a, **k: installed.append("ray.init wrapper"))
    return installed


def test_a_cpu_only_driver_joining_a_cluster_with_gpus_applies_no_cpu_patch(fake_cluster, recorded_apply):
    set_nodes, calls = fake_cluster
    set_nodes([CPU_HEAD, GPU_NODE])
    assert cpu.apply() is False
    assert recorded_apply == [] and cpu.ENV_ACTIVE not in os.environ
    assert calls == [ADDRESS]  # asked once (by a child process: OpenRLHF's train connects later)


def test_a_cpu_only_driver_joining_a_stand_in_cluster_applies_the_cpu_layer(fake_cluster, recorded_apply):
    set_nodes, _ = fake_cluster
    set_nodes([STAND_IN_NODE])
    assert cpu.apply() is True
    assert recorded_apply == [cpu.DRIVER, "ray.init wrapper"] and os.environ[cpu.ENV_ACTIVE] == "1"


CLI_RUN = ["--dppo.method", "grpo", "--reward.remote_url", "r.py", "--actor.model_name_or_path", "m"]


def run_cli(monkeypatch):
    """The command line up to OpenRLHF's ``train``: what reached ``cpu.apply``, ``install`` and train."""
    from openrlhf.cli import train_ppo_ray

    import openrlhf_dppo.adapters as adapters
    from openrlhf_dppo.cli import train_dppo_ray as cli

    seen: dict = {"apply": []}
    monkeypatch.setattr(cpu, "apply", lambda **kw: seen["apply"].append(kw) or True)
    monkeypatch.setattr(adapters, "install", lambda cfg, run: seen.update(run=run))
    monkeypatch.setattr(train_ppo_ray, "train", lambda args: seen.update(args=args))
    cli.main(CLI_RUN, check_inputs=False)
    return seen


def test_the_cli_on_a_cpu_only_head_of_a_gpu_cluster_leaves_the_gpu_run_as_openrlhf_has_it(
    fake_cluster, monkeypatch
):
    set_nodes, _ = fake_cluster
    set_nodes([CPU_HEAD, GPU_NODE])
    monkeypatch.setenv(precision.ENV, "fp32")  # what a CPU run here would default --ds.param_dtype to
    seen = run_cli(monkeypatch)
    assert seen["apply"] == []  # no CPU patch, no stand-in GPU
    assert seen["args"].ds.param_dtype == "bf16"  # OpenRLHF's default, not this head's CPU choice
    assert seen["run"].device == "cuda"  # what run_config.json records (precision.machine)


def test_a_cpu_only_head_asks_the_cluster_after_the_command_line_and_settles_the_dtype_then(
    fake_cluster, monkeypatch, capsys
):
    from openrlhf_dppo.cli import train_dppo_ray as cli

    set_nodes, calls = fake_cluster
    monkeypatch.setenv(precision.ENV, "fp32")
    for argv in (["--help"], CLI_RUN + ["--dppo.q_min", "2"]):  # nothing is asked before the parse and checks
        with pytest.raises(SystemExit):
            cli.main(argv, train_fn=lambda a: a)
    assert calls == []
    set_nodes([CPU_HEAD, GPU_NODE])  # a GPU run: fp32 is a CPU run's, refused by name once that is known
    with pytest.raises(SystemExit) as err:
        cli.main(CLI_RUN + ["--ds.param_dtype", "fp32"], train_fn=lambda a: a)
    assert err.value.code == 2 and calls == [ADDRESS]
    assert (
        "error: --ds.param_dtype fp32: this is a CUDA run, where OpenRLHF takes bf16 or fp16"
        in capsys.readouterr().err
    )
    set_nodes([STAND_IN_NODE])  # a CPU run: the flag's default is the CPU's choice, fp32 is taken
    assert cli.main(CLI_RUN, train_fn=lambda a: a).ds.param_dtype == "fp32"
    assert cli.main(CLI_RUN + ["--ds.param_dtype", "bf16"], train_fn=lambda a: a).ds.param_dtype == "bf16"


def test_the_cli_on_a_machine_without_cuda_and_its_own_ray_runs_the_cpu_layer(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(precision.ENV, "fp32")
    seen = run_cli(monkeypatch)
    (applied,) = seen["apply"]
    assert applied["precision"] == "fp32" == seen["args"].ds.param_dtype and applied["choice"].device == "cpu"
    assert seen["run"].device == "cpu"


def test_a_bad_device_variable_stops_the_cli_before_ray_naming_it(monkeypatch, capsys):
    from openrlhf_dppo.cli import train_dppo_ray as cli

    monkeypatch.setenv(dc.ENV_DEVICE, "tpu")
    with pytest.raises(SystemExit) as err:
        cli.main(CLI_RUN, train_fn=lambda a: a)
    assert err.value.code == 2
    assert "error: OPENRLHF_DPPO_DEVICE='tpu': expected one of auto, cpu, cuda" in capsys.readouterr().err


# ---- each Ray worker's own check ----------------------------------------------------------------------
@pytest.fixture
def worker(monkeypatch):
    """worker_setup with its installers recorded; returns (set what the worker's torch sees, calls)."""
    calls: list[str] = []
    monkeypatch.setattr(_host, "prepare_host", lambda: calls.append("prepare_host"))
    monkeypatch.setattr(cpu, "install", lambda site: calls.append(site) or [])
    return lambda cuda: monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda), calls


def test_a_ray_worker_that_sees_cuda_refuses_the_cpu_layer_by_name_and_patches_nothing(worker, monkeypatch):
    sees_cuda, calls = worker
    sees_cuda(True)
    monkeypatch.setenv(dc.ENV_DEVICE, "cpu")  # as the driver's runtime_env hands it over
    with pytest.raises(RuntimeError) as err:
        cpu.worker_setup()
    assert isinstance(err.value, dc.DeviceMismatch) and calls == []
    message = str(err.value)
    assert "sees CUDA, but the driver decided this is a CPU run (OPENRLHF_DPPO_DEVICE=cpu there)" in message
    assert "Start the driver with OPENRLHF_DPPO_DEVICE=cuda" in message


def test_a_ray_worker_without_cuda_installs_its_cpu_patches(worker):
    sees_cuda, calls = worker
    sees_cuda(False)
    cpu.worker_setup()
    assert calls == ["prepare_host", cpu.RAY_WORKER]


def test_the_workers_are_handed_the_device_variable(monkeypatch):
    monkeypatch.setenv(dc.ENV_DEVICE, "cpu")
    env = ray_init_kwargs({}, fake_gpus=1, num_cpus=None)["runtime_env"]["env_vars"]
    assert env[dc.ENV_DEVICE] == "cpu"
