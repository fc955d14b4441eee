"""What the run will read and write, checked on this machine before Ray starts (``validate.check_input_files``).

- Output directories: the directory, or its nearest existing parent, must take a probe directory.
- A reward-function or agent ``.py`` file is imported in a child process, as OpenRLHF 0.11.2 loads it:
  ``reward_func(queries, prompts, labels)``, or a class ``AgentExecutor``.
- A reward URL must accept a TCP connection within ``URL_TIMEOUT_S`` (no HTTP request is sent).
- Dataset keys: the first record of each local ``.jsonl`` / ``.json`` / ``.csv`` / ``.parquet`` file must
  have ``--data.input_key`` (and ``--data.label_key``); other datasets are left to OpenRLHF.
Imports no host module (OpenRLHF, Ray, DeepSpeed, vLLM).
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
from urllib.parse import urlsplit

URL_TIMEOUT_S = 5.0
IMPORT_TIMEOUT_S = 300.0
READ_LIMIT = 1 << 20  # bytes read from a data file to find its first record


class InputError(ValueError):
    """A file or endpoint the run cannot use; ``str(err)`` is the message after ``<flag>: ``."""


def check_writable_dir(path: str) -> None:
    """``path`` is, or can be created as, a directory this process can write in. Raises InputError."""
    full = os.path.abspath(os.path.expanduser(path))
    probe = full
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        what = "exists and is not a directory" if probe == full else f"cannot be created: {probe} is a file"
        raise InputError(f"{path}: {what}; expected a directory this run can write in")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dppo-write-test-", dir=probe))
    except OSError as err:
        where = "cannot write in it" if probe == full else f"cannot create it in {probe}"
        raise InputError(
            f"{path}: not writable ({where}: {err.strerror}); expected a writable directory"
        ) from None


# Runs in a child: imports the file as OpenRLHF does, checks the named object, prints one line on failure.
_IMPORT_CHECK = r"""
import importlib.util, inspect, sys, traceback
path, kind = sys.argv[1], sys.argv[2]
try:
    spec = importlib.util.spec_from_file_location("dppo_input_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
except BaseException as err:
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == path]
    line = getattr(err, "lineno", None) if isinstance(err, SyntaxError) else (lines[-1] if lines else None)
    where = f" (line {line})" if line else ""
    text = " ".join(str(err).split())[:300]
    print(f"does not import: {type(err).__name__}: {text}{where}")
    sys.exit(1)
if kind == "reward":
    fn = getattr(module, "reward_func", None)
    if not callable(fn):
        print("has no function reward_func(queries, prompts, labels), which OpenRLHF calls for the rewards")
        sys.exit(1)
    try:
        inspect.signature(fn).bind(None, None, None)
    except TypeError:
        print(f"reward_func{inspect.signature(fn)} cannot be called as reward_func(queries, prompts, labels)")
        sys.exit(1)
    except ValueError:
        pass  # no signature to read (a builtin): the call will tell
else:
    cls = getattr(module, "AgentExecutor", None)
    base = getattr(sys.modules.get("openrlhf.utils.agent"), "AgentExecutorBase", None)
    if not isinstance(cls, type) or (base is not None and not issubclass(cls, base)):
        print("has no class AgentExecutor (a subclass of openrlhf.utils.agent.AgentExecutorBase)")
        sys.exit(1)
"""


def check_python_file(path: str, kind: str) -> None:
    """Import ``path`` in a child process and check OpenRLHF's contract; kind: "reward" or "agent"."""
    try:
        res = subprocess.run(
            [sys.executable, "-c", _IMPORT_CHECK, os.path.abspath(path), kind],
            capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InputError(f"{path}: importing it took more than {IMPORT_TIMEOUT_S:.0f} s") from None
    if res.returncode != 0:
        lines = res.stdout.strip().splitlines() or res.stderr.strip().splitlines()[-1:]
        raise InputError(f"{path} {lines[-1] if lines else 'could not be imported'}")


def check_url_answers(url: str, timeout_s: float = URL_TIMEOUT_S) -> None:
    """``url``'s host accepts a TCP connection on its port within ``timeout_s``."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InputError(f"{url}: not a valid port") from None
    if not parts.hostname:
        raise InputError(f"{url}: no host name")
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout_s):
            pass
    except socket.gaierror:
        raise InputError(f"{url}: the host name {parts.hostname} does not resolve") from None
    except TimeoutError:
        raise InputError(f"{url}: no answer from {parts.hostname}:{port} within {timeout_s:.0f} s") from None
    except OSError as err:
        raise InputError(
            f"{url}: nothing answers at {parts.hostname}:{port} ({err.strerror or err}); start the reward "
            "server first"
        ) from None


def first_record(path: str) -> dict | None:
    """The first record of a local data file as a dict of its fields; None when it cannot be read here
    (an extension or layout this module does not read, or a file too large to parse in part)."""
    ext = os.path.splitext(path)[1].lower()
    if ext == ".csv":
        with open(path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), None)
        return dict.fromkeys(header or [])
    if ext == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            return None
        return dict.fromkeys(pq.read_schema(path).names)
    if ext not in (".json", ".jsonl"):
        return None
    with open(path, encoding="utf-8") as fh:
        text = fh.read(READ_LIMIT)
    body = text.lstrip()
    if body.startswith("["):  # a JSON array of records
        try:
            record, _ = json.JSONDecoder().raw_decode(body, body.index("{"))
        except (ValueError, json.JSONDecodeError):
            return None
        return record if isinstance(record, dict) else None
    line = next((x for x in body.splitlines() if x.strip()), "")  # JSON Lines
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def missing_key(path: str, keys: dict[str, str | None]) -> tuple[str, str] | None:
    """(flag, message) for the first of ``keys`` ({flag: key}) that the first record of ``path`` lacks;
    None when all are there or the file is not read here."""
    record = first_record(path)
    if record is None:
        return None
    for flag, key in keys.items():
        if key is not None and key not in record:
            fields = ", ".join(repr(k) for k in list(record)[:12]) or "none"
            return flag, f"{key!r} is not a field of the first record of {path} (its fields: {fields})"
    return None
