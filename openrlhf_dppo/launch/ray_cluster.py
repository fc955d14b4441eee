"""A Ray cluster across the tasks of one Slurm job (one task per node; docs/SLURM.md): task 0 starts the
head and publishes ``ip:port`` in a shared rendezvous folder, waits for every node, runs the driver with
``RAY_ADDRESS`` set and marks ``done``; the others join and leave on ``done``. Rendezvous files and Ray
temp dirs are keyed by job id and restart count.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from openrlhf_dppo.launch.procs import ignore_job_signals, signals_held, stop_process_group


class RayClusterError(RuntimeError):
    """The Ray cluster of a Slurm job could not be formed (head missing, nodes missing, Ray died)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """The address other hosts reach this node at: the interface of the default route, else what the
    hostname resolves to."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def ray_executable() -> str:
    """The `ray` next to the running Python (the job must use the same environment everywhere)."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.exists() else (shutil.which("ray") or "ray")


def ray_start_command(
    *,
    head: bool,
    address: str,
    num_cpus: int | None,
    num_gpus: int,
    temp_dir: str | os.PathLike,
    ports: dict[str, int] | None = None,
) -> list[str]:
    """`ray start --block` for a head (`address` = "ip:port" it listens on) or a worker joining `address`;
    `temp_dir` is private to the job, so that no other job's bare `ray.init()` finds this cluster."""
    ip, port = address.rsplit(":", 1)
    cmd = [ray_executable(), "start", "--block", "--disable-usage-stats", f"--num-gpus={num_gpus}"]
    cmd.append(f"--temp-dir={temp_dir}")
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if head:
        cmd += ["--head", f"--node-ip-address={ip}", f"--port={port}", "--include-dashboard=false"]
    else:
        cmd += [f"--address={address}"]
    ports = ports if ports is not None else {}
    for flag in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port"):
        cmd.append(f"--{flag}={ports.get(flag) or free_port()}")
    return cmd


@dataclass(frozen=True)
class Rendezvous:
    """Files in a shared folder through which the tasks of one job (one restart of it) meet, and the
    Ray temp dir each node of that restart uses on its local disk."""

    root: Path  # shared by all nodes (the job folder)
    job_id: str
    restart: int
    temp_root: Path = Path("/tmp")  # local; short: Ray puts Unix sockets under it

    @classmethod
    def for_job(
        cls, root: str | os.PathLike, job_id: str, restart: int, temp_root: str | os.PathLike = "/tmp"
    ) -> Rendezvous:
        return cls(Path(root), str(job_id), int(restart), Path(temp_root))

    @property
    def folder(self) -> Path:
        return self.root / f"ray_{self.job_id}_r{self.restart}"

    @property
    def ray_temp_dir(self) -> str:
        """Ray's temp dir on each node, private to this restart of the job."""
        return str(self.temp_root / f"ray_dppo_{self.folder.name}")

    def remove_stale_temp_dirs(self) -> list[Path]:
        """Remove (and return) the Ray temp dirs that earlier restarts of this job left on this node."""
        pattern = re.compile(rf"ray_dppo_ray_{re.escape(self.job_id)}_r(\d+)")
        stale = []
        for path in sorted(self.temp_root.glob(f"ray_dppo_ray_{self.job_id}_r*")):
            m = pattern.fullmatch(path.name)
            if m and int(m.group(1)) < self.restart and path.is_dir():
                stale.append(path)
                shutil.rmtree(path, ignore_errors=True)
        return stale

    def _touch(self, name: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / name).touch()

    def request_requeue(self) -> None:
        """Written by whoever requeues the job (slurm/dppo_ray.sbatch on its signal) before stopping it."""
        self._touch("requeue")

    def requeue_requested(self) -> bool:
        return (self.folder / "requeue").exists()

    def mark_done(self) -> None:
        self._touch("done")

    def is_done(self) -> bool:
        return (self.folder / "done").exists()

    def publish_head(self, address: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = self.folder / "head.json.tmp"
        tmp.write_text(json.dumps({"address": address, "host": socket.gethostname()}))
        tmp.replace(self.folder / "head.json")  # atomic: a reader never sees half a file

    def wait_head(self, timeout_s: float, poll_s: float = 0.5) -> str:
        head = self.folder / "head.json"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if head.exists():
                return json.loads(head.read_text())["address"]
            if self.is_done():
                raise RayClusterError(f"the head finished before this node joined ({self.folder})")
            time.sleep(poll_s)
        raise RayClusterError(
            f"no Ray head address after {timeout_s:.0f}s in {head}: task 0 did not start Ray "
            "(see its log) or the folder is not shared between the nodes"
        )


def _count_nodes_main(address: str, expected: int, timeout_s: float) -> int:
    """Child process: connect as a driver, poll until `expected` nodes are alive. Exit 0 / 1 + message."""
    import ray

    deadline = time.monotonic() + timeout_s
    nodes: list[str] = []
    host, port = address.rsplit(":", 1)
    while True:
        try:
            if not ray.is_initialized():
                # ray.init against a head that is not listening yet can block for minutes
                socket.create_connection((host, int(port)), timeout=2.0).close()
                ray.init(address=address, logging_level="WARNING", log_to_driver=False)
            nodes = sorted(n["NodeManagerAddress"] + "/" + n["NodeID"][:8] for n in ray.nodes() if n["Alive"])
        except (OSError, RuntimeError) as e:  # the head is not serving yet (ConnectionError is an OSError)
            print(f"waiting for the head: {e}", file=sys.stderr)
            ray.shutdown()
        if len(nodes) >= expected:
            print(json.dumps(nodes))
            return 0
        if time.monotonic() > deadline:
            print(
                f"only {len(nodes)} of {expected} Ray nodes joined {address} within {timeout_s:.0f}s: "
                f"{nodes or 'none'}. Check the logs of the tasks whose node is missing.",
                file=sys.stderr,
            )
            return 1
        time.sleep(1.0)


def wait_for_nodes(
    address: str, expected: int, timeout_s: float, head: subprocess.Popen | None = None
) -> list[str]:
    """Block until `expected` Ray nodes are alive; RayClusterError naming the nodes that joined otherwise.
    The polling driver is a child process: `ray.init` would replace submitit's signal handlers here."""
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "wait-nodes", address, str(expected), str(timeout_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=ignore_job_signals,
    )
    hard_deadline = time.monotonic() + timeout_s + 30.0  # ray.init to an unreachable head can hang
    try:
        while child.poll() is None:
            if head is not None and head.poll() is not None:
                raise RayClusterError(
                    f"the Ray head exited with code {head.returncode} while waiting for nodes"
                )
            if time.monotonic() > hard_deadline:
                raise RayClusterError(f"no answer from the Ray head at {address} within {timeout_s:.0f}s")
            time.sleep(0.5)
        out, err = child.communicate()
    finally:
        stop_process_group(child, grace_s=2.0)
    if child.returncode != 0:
        last = [ln for ln in err.strip().splitlines() if ln.strip()][-1:] or [f"exit code {child.returncode}"]
        raise RayClusterError(last[0])
    return json.loads(out.strip().splitlines()[-1])


def run_head(
    rdv: Rendezvous,
    driver_cmd: list[str],
    *,
    num_nodes: int,
    num_cpus: int | None,
    num_gpus: int,
    port: int,
    join_timeout_s: float,
    env: dict[str, str] | None = None,
    on_head_start=None,
    on_driver_start=None,
    on_driver_exit=None,
) -> int:
    """Task 0: start the head, wait for `num_nodes` nodes, run `driver_cmd`; returns its exit code
    (`Popen.returncode`: negative for a signal) once the driver and Ray are stopped.
    `on_driver_exit(returncode)` runs once the driver is gone, before Ray is stopped, signals held."""
    address = f"{node_ip()}:{port}"
    head = subprocess.Popen(
        ray_start_command(
            head=True, address=address, num_cpus=num_cpus, num_gpus=num_gpus, temp_dir=rdv.ray_temp_dir
        ),
        start_new_session=True,
        preexec_fn=ignore_job_signals,
    )
    driver = None
    try:
        if on_head_start is not None:
            on_head_start(head)
        rdv.publish_head(address)
        nodes = wait_for_nodes(address, num_nodes, join_timeout_s, head=head)
        print(f"[dppo-launch] Ray cluster ready at {address}: {len(nodes)} nodes {nodes}", flush=True)
        driver_env = dict(os.environ if env is None else env)
        driver_env["RAY_ADDRESS"] = address
        print(f"[dppo-launch] running: {' '.join(driver_cmd)}", flush=True)
        driver = subprocess.Popen(
            driver_cmd, env=driver_env, start_new_session=True, preexec_fn=ignore_job_signals
        )
        if on_driver_start is not None:
            on_driver_start(driver)
        return driver.wait()
    finally:
        with signals_held():
            rdv.mark_done()
            stop_process_group(driver)
            try:
                if on_driver_exit is not None and driver is not None and driver.returncode is not None:
                    on_driver_exit(driver.returncode)
            finally:
                stop_process_group(head)
                shutil.rmtree(rdv.ray_temp_dir, ignore_errors=True)


def run_worker(
    rdv: Rendezvous, *, num_cpus: int | None, num_gpus: int, join_timeout_s: float, lost_grace_s: float = 60.0
) -> None:
    """Tasks 1..N-1: join the head, stay until the head marks the job done. If this node's Ray dies
    first, RayClusterError once the head has not finished within `lost_grace_s`."""
    address = rdv.wait_head(join_timeout_s)
    worker = subprocess.Popen(
        ray_start_command(
            head=False, address=address, num_cpus=num_cpus, num_gpus=num_gpus, temp_dir=rdv.ray_temp_dir
        ),
        start_new_session=True,
        preexec_fn=ignore_job_signals,
    )
    try:
        lost_since = None
        while not rdv.is_done():
            if lost_since is None and worker.poll() is not None:
                lost_since = time.monotonic()
                print(
                    f"[dppo-launch] this node's Ray exited ({worker.returncode}); waiting for the head",
                    flush=True,
                )
            if lost_since is not None and time.monotonic() - lost_since > lost_grace_s:
                raise RayClusterError(
                    f"the Ray worker exited with code {worker.returncode} before the job ended, and the head "
                    f"did not finish within {lost_grace_s:.0f}s"
                )
            time.sleep(1.0)
    finally:
        with signals_held():
            stop_process_group(worker)
            shutil.rmtree(rdv.ray_temp_dir, ignore_errors=True)


if __name__ == "__main__":  # the node-count child of wait_for_nodes
    if len(sys.argv) != 5 or sys.argv[1] != "wait-nodes":
        sys.exit("usage: ray_cluster.py wait-nodes ADDRESS EXPECTED TIMEOUT_S")
    sys.exit(_count_nodes_main(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
