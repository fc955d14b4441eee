"""The Slurm launcher without a cluster: command building, sbatch parameters, dry-run, rendezvous, teardown."""

import os
import signal
import subprocess
import sys
import time

import pytest

from openrlhf_dppo.launch import command as C
from openrlhf_dppo.launch import resources as R
from openrlhf_dppo.launch import slurm as L
from openrlhf_dppo.launch.procs import pid_running, stop_process_group, terminate_group
from openrlhf_dppo.launch.ray_cluster import RayClusterError, Rendezvous, ray_start_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_flags_are_read_and_replaced_in_both_spellings():
    argv = ["--a", "1", "--ckpt.path=/x", "--flag", "--b", "2", "--a", "3"]
    assert C.get_flag(argv, "--a") == "3"  # argparse keeps the last value, so do we
    assert C.get_flag(argv, "--ckpt.path") == "/x"
    assert C.get_flag(argv, "--flag") == ""
    assert C.get_flag(argv, "--missing") is None
    assert C.set_flag(argv, "--a", "9") == ["--ckpt.path=/x", "--flag", "--b", "2", "--a", "9"]
    assert C.set_flag(argv, "--ckpt.path", "/y") == [
        "--a",
        "1",
        "--flag",
        "--b",
        "2",
        "--a",
        "3",
        "--ckpt.path",
        "/y",
    ]
    assert C.set_flag(argv, "--flag", None) == [
        "--a",
        "1",
        "--ckpt.path=/x",
        "--b",
        "2",
        "--a",
        "3",
        "--flag",
    ]


def test_train_command_always_resumes_and_saves(tmp_path):
    cmd = C.build_train_command(
        ["--actor.x", "1", "--ckpt.save_steps", "-1"], run_dir=tmp_path / "run", save_steps=7
    )
    a = cmd.argv
    assert a[:3] == [sys.executable, "-m", C.DEFAULT_ENTRY]
    assert C.get_flag(a, "--ckpt.output_dir") == str(tmp_path / "run")
    assert C.get_flag(a, "--ckpt.path") == str(tmp_path / "run" / "ckpt") == str(cmd.ckpt_path)
    assert C.get_flag(a, "--ckpt.load_enable") == ""  # bare switch: a restart loads the newest checkpoint
    assert C.get_flag(a, "--ckpt.save_steps") == "7"  # a config that never saves cannot be resumed
    assert a.count("--ckpt.save_steps") == 1 and C.get_flag(a, "--actor.x") == "1"


def test_train_command_keeps_the_configs_checkpoint_settings(tmp_path):
    cfg = [
        "--ckpt.output_dir",
        str(tmp_path / "out"),
        "--ckpt.path",
        str(tmp_path / "ck"),
        "--ckpt.save_steps",
        "3",
    ]
    cmd = C.build_train_command(cfg, save_steps=100, entry="my_train.py")
    assert cmd.run_dir == tmp_path / "out" and cmd.ckpt_path == tmp_path / "ck"
    assert C.get_flag(cmd.argv, "--ckpt.save_steps") == "3"
    assert cmd.argv[1] == os.path.abspath("my_train.py")  # a script runs by absolute path
    with pytest.raises(ValueError, match="save_steps must be positive"):
        C.build_train_command(cfg, save_steps=0)


@pytest.mark.parametrize(
    "text,minutes",
    [
        ("90", 90),
        ("01:30:00", 90),
        ("10:30", 11),
        ("1-00:00:00", 1440),
        ("2-1", 2940),
        ("0:0:59", 1),
        (45, 45),
    ],
)
def test_slurm_time_formats(text, minutes):
    assert R.parse_time_minutes(text) == minutes


def test_bad_time_is_refused():
    with pytest.raises(ValueError, match="cannot read Slurm time"):
        R.parse_time_minutes("1h")
    # submitit signals 90 s before the end: a 2-minute job would be signalled almost at once
    with pytest.raises(ValueError, match="leaves no time to train"):
        R.SlurmResources(time_min=2)


def test_cpu_job_requests_no_gres_and_gpu_job_does():
    cpu = R.SlurmResources(nodes=2, gpus_per_node=0, time_min=30).submitit_parameters()
    assert "gpus_per_node" not in cpu and "gres" not in cpu
    assert cpu["nodes"] == 2 and cpu["ntasks_per_node"] == 1 and cpu["time"] == 30
    assert cpu["additional_parameters"] == {"requeue": True}
    gpu = R.SlurmResources(
        nodes=4, gpus_per_node=8, partition="p", account="a", qos="q", extra={"reservation": "r"}
    )
    params = gpu.submitit_parameters()
    assert params["gpus_per_node"] == 8
    assert (params["partition"], params["account"], params["qos"]) == ("p", "a", "q")
    assert params["additional_parameters"] == {"requeue": True, "reservation": "r"}
    with pytest.raises(ValueError, match="gpus-per-node must be >= 0"):
        R.SlurmResources(gpus_per_node=-1)


def test_sbatch_script_is_what_submitit_writes(tmp_path):
    text = R.sbatch_script(
        R.SlurmResources(nodes=2, gpus_per_node=0, time_min=20, partition="debug"), tmp_path
    )
    lines = set(text.splitlines())
    for line in (
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --partition=debug",
        "#SBATCH --requeue",
        "#SBATCH --signal=USR2@90",
        "#SBATCH --time=20",
    ):
        assert line in lines, line
    assert "gpus" not in text and "gres" not in text
    assert "submitit.core._submit" in text


def _write_config(path, args_yaml: str):
    path.write_text("entry: tests.fake.entry\nvars:\n  NNODES: 1\n  GPUS_PER_NODE: 8\nargs:\n" + args_yaml)
    return path


def test_dry_run_prints_sbatch_and_command_and_follows_the_allocation(tmp_path, capsys):
    cfg = _write_config(
        tmp_path / "exp.yaml",
        "  actor: {num_nodes: '${NNODES}', num_gpus_per_node: '${GPUS_PER_NODE}'}\n  max_steps: 3\n",
    )
    rc = L.main(
        ["--config", str(cfg), "--nodes", "3", "--gpus-per-node", "4", "--time", "00:30:00"]
        + ["--run-dir", str(tmp_path / "run"), "--partition", "gpu", "--dry-run", "--", "--max_steps", "5"]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "#SBATCH --nodes=3" in out and "#SBATCH --gpus-per-node=4" in out and "#SBATCH --time=30" in out
    command = out.strip().splitlines()[-1].split()
    assert command[1:3] == ["-m", "tests.fake.entry"]
    assert C.get_flag(command, "--actor.num_nodes") == "3"  # the config's NNODES follows --nodes
    assert C.get_flag(command, "--actor.num_gpus_per_node") == "4"
    assert C.get_flag(command, "--max_steps") == "5"  # flags after `--` win
    assert C.get_flag(command, "--ckpt.path") == str(tmp_path / "run" / "ckpt")
    assert not (tmp_path / "run").exists()  # a dry run writes nothing


def test_cli_reports_bad_input_readably(tmp_path, capsys):
    cfg = _write_config(tmp_path / "exp.yaml", "  max_steps: 3\n")
    assert L.main(["--config", str(cfg), "--time", "1", "--dry-run"]) == 2
    assert "leaves no time to train" in capsys.readouterr().err
    assert L.main(["--config", str(tmp_path / "missing.yaml"), "--dry-run"]) == 2
    assert "missing.yaml" in capsys.readouterr().err


def test_ray_start_command_for_head_and_worker(tmp_path):
    head = ray_start_command(head=True, address="10.0.0.1:6390", num_cpus=4, num_gpus=0, temp_dir=tmp_path)
    assert "--head" in head and "--port=6390" in head and "--node-ip-address=10.0.0.1" in head
    assert "--block" in head and "--num-cpus=4" in head and "--num-gpus=0" in head
    assert f"--temp-dir={tmp_path}" in head  # a private temp dir: a bare ray.init() elsewhere never finds us
    worker = ray_start_command(
        head=False, address="10.0.0.1:6390", num_cpus=None, num_gpus=8, temp_dir=tmp_path
    )
    assert "--address=10.0.0.1:6390" in worker and "--head" not in worker
    assert not any(a.startswith("--num-cpus") for a in worker)


def test_rendezvous_is_per_restart_and_times_out_readably(tmp_path):
    rdv = Rendezvous.for_job(tmp_path, "42", restart=0)
    rdv.publish_head("10.0.0.1:6390")
    assert rdv.wait_head(1.0) == "10.0.0.1:6390"
    assert not rdv.is_done()
    rdv.mark_done()
    assert rdv.is_done()
    again = Rendezvous.for_job(tmp_path, "42", restart=1)  # the requeued job must not read the old address
    with pytest.raises(RayClusterError, match="no Ray head address after 0s"):
        again.wait_head(0.3, poll_s=0.05)


def test_process_groups_are_stopped_including_grandchildren():
    # a shell that ignores SIGTERM and leaves a grandchild: SIGKILL after the grace, whole group gone
    proc = subprocess.Popen(["bash", "-c", "trap '' TERM; sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 20
    while not subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True).stdout.strip():
        assert time.monotonic() < deadline, "the shell did not start its child"
        time.sleep(0.05)  # the trap is set before the child starts
    t0 = time.monotonic()
    stop_process_group(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL and time.monotonic() - t0 < 5
    # the grandchild too (at most a zombie nobody reaps): SIGKILL takes effect when the grandchild next
    # runs, which on a loaded machine can be after the call returns, so wait for it to a deadline
    deadline = time.monotonic() + 5
    while running := _running_in_group(proc.pid):
        assert time.monotonic() < deadline, f"still running 5 s after SIGKILL: {running}"
        time.sleep(0.02)


def _running_in_group(pgid: int) -> list[int]:
    running = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                running.append(int(entry))
    return running


def test_terminate_group_does_not_reap_and_sees_zombies_as_stopped():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    assert pid_running(proc.pid)
    terminate_group(proc.pid, grace_s=5)
    assert not pid_running(proc.pid)  # a zombie until reaped: exited
    assert proc.wait(timeout=5) == -signal.SIGTERM


def test_waiting_for_nodes_times_out_with_a_readable_error():
    from openrlhf_dppo.launch.ray_cluster import free_port, wait_for_nodes

    t0 = time.monotonic()
    with pytest.raises(
        RayClusterError, match=r"only 0 of 2 Ray nodes joined 127\.0\.0\.1:\d+ within 2s: none"
    ):
        wait_for_nodes(f"127.0.0.1:{free_port()}", expected=2, timeout_s=2.0)  # nobody listens there
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(
    "gpus, present, runs",
    [
        ("8", (".venv", ".venv-gpu"), ".venv-gpu"),  # a GPU job: the GPU install's (scripts/setup_gpu.sh)
        ("0", (".venv", ".venv-gpu"), ".venv"),  # a CPU job: make setup-cpu's
        ("8", (".venv",), ".venv"),  # the other one when that is missing
        (None, (".venv-gpu",), ".venv-gpu"),
    ],
)
def test_the_sbatch_script_runs_the_venv_of_its_jobs_kind(tmp_path, gpus, present, runs):
    # stand-in interpreters that say who they are and fail: the script stops after building the command
    said = tmp_path / "said"
    for venv in present:
        python = tmp_path / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\necho {venv} >> "{said}"\nexit 1\n')
        python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON", "SLURM_GPUS_ON_NODE")}
    env.update(
        SLURM_SUBMIT_DIR=str(tmp_path), CONFIG="c.yaml", **({"SLURM_GPUS_ON_NODE": gpus} if gpus else {})
    )
    sbatch = os.path.join(REPO, "slurm", "dppo_ray.sbatch")
    proc = subprocess.run(["bash", sbatch], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "could not build the training command" in proc.stderr, proc.stderr
    assert said.read_text().split() == [runs]
