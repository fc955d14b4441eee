"""`make test-slurm` stops the local cluster it started -- also when a test fails or the start itself
fails -- unless KEEP_CLUSTER=1 or the cluster was already up. The cluster script and the Slurm tests are
replaced by stand-ins (the Makefile's CLUSTER and SLURM_TESTS), so this needs neither root nor Slurm.
Every test marked slurm is in the one folder the target runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STUB = """#!/usr/bin/env bash
echo "$1" >> "{log}"
case "$1" in
  status) exit {status_rc} ;;
  up) exit {up_rc} ;;
  down) exit 0 ;;
esac
"""


def make_test_slurm(tmp_path, tests: str, status_rc: int = 1, up_rc: int = 0, **env: str):
    """Runs the target with the stand-ins; returns (exit code, the cluster script's calls in order)."""
    log = tmp_path / "calls.log"
    stub = tmp_path / "cluster.sh"
    stub.write_text(STUB.format(log=log, status_rc=status_rc, up_rc=up_rc))
    full = {k: v for k, v in os.environ.items() if k not in ("KEEP_CLUSTER", "MAKEFLAGS", "MAKELEVEL")}
    full.update(env)
    cmd = ["make", "-s", "-o", "setup-cpu", "test-slurm", f"CLUSTER=bash {stub}", f"SLURM_TESTS={tests}"]
    # a Makefile that ignores the stand-ins would start a real cluster as root: read the recipe first
    dry = subprocess.run([*cmd[:2], "-n", *cmd[2:]], cwd=REPO, env=full, capture_output=True, text=True)
    assert str(stub) in dry.stdout and "local_cluster.sh" not in dry.stdout, dry.stdout
    res = subprocess.run(cmd, cwd=REPO, env=full, capture_output=True, text=True, timeout=60)
    calls = log.read_text().split() if log.exists() else []
    return res.returncode, calls


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def test_a_failing_suite_still_stops_the_cluster_and_keeps_its_failure(tmp_path):
    rc, calls = make_test_slurm(tmp_path, "exit 3")
    assert rc != 0 and calls == ["status", "up", "down"]


def test_a_passing_suite_stops_the_cluster(tmp_path):
    rc, calls = make_test_slurm(tmp_path, "true")
    assert rc == 0 and calls == ["status", "up", "down"]


def test_a_cluster_that_failed_to_start_is_stopped_too(tmp_path):
    """`up` may have started munged and MariaDB before it gave up."""
    rc, calls = make_test_slurm(tmp_path, "true", up_rc=1)
    assert rc != 0 and calls == ["status", "up", "down"]


def test_keep_cluster_leaves_it_running(tmp_path):
    rc, calls = make_test_slurm(tmp_path, "exit 3", KEEP_CLUSTER="1")
    assert rc != 0 and calls == ["up"]


def test_a_cluster_that_was_up_before_is_left_up(tmp_path):
    rc, calls = make_test_slurm(tmp_path, "true", status_rc=0)
    assert rc == 0 and calls == ["status", "up"]


def test_every_slurm_test_is_in_the_folder_make_test_slurm_runs():
    # test-slurm collects one folder (the unit and e2e runs deselect the marker): a slurm test anywhere
    # else would run in no target at all
    recipe = re.search(r"^SLURM_TESTS := (.*)$", Path(REPO, "Makefile").read_text(), re.M).group(1)
    assert "-m slurm tests/slurm " in recipe + " ", recipe
    marker = re.compile(r"\bmark\.slurm\b")
    found = [
        str(path.relative_to(REPO))
        for top in ("tests", "research")
        for path in sorted(Path(REPO, top).rglob("*.py"))
        if marker.search(path.read_text(encoding="utf-8"))
    ]
    assert found and all(f.startswith("tests/slurm/") for f in found), found
