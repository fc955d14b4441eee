"""The precision of the CPU pipeline, chosen from what torch reports about the CPU, and the machine record.

On a CPU run only (docs/CPU.md, "Precision on CPU"): ``OPENRLHF_DPPO_CPU_PRECISION`` = ``auto`` (default)
| ``bf16`` | ``fp32``; ``auto`` is bf16 where oneDNN has bf16 kernels
(``torch.ops.mkldnn._is_mkldnn_bf16_supported()``), else fp32; ``--ds.param_dtype`` on the command line
wins. The choice becomes ``--ds.param_dtype``. On a GPU run nothing here applies.

    python -m openrlhf_dppo.precision [auto|bf16|fp32] [--name VAR]   prints bf16 or fp32

Standard library at import; torch is imported by the functions that ask it.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from dataclasses import dataclass
from typing import Any

from openrlhf_dppo import run_dir

ENV = "OPENRLHF_DPPO_CPU_PRECISION"
AUTO = "auto"
CHOICES = (AUTO, "bf16", "fp32")
FLAG = "--ds.param_dtype"
FLAG_DEST = "ds.param_dtype"
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # --ds.param_dtype -> torch
ISA_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # environment caps on the CPU's instruction set
INDUCTOR_CACHE = "TORCHINDUCTOR_CACHE_DIR"  # torch.compile's kernel cache (see separate_inductor_cache)
INDUCTOR_CACHE_OURS = "OPENRLHF_DPPO_INDUCTOR_CACHE"  # the folder separate_inductor_cache chose
INDUCTOR_PCH = "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"  # written to torch's default folder when on
INDUCTOR_ENV = (INDUCTOR_CACHE, INDUCTOR_CACHE_OURS, INDUCTOR_PCH)  # what every process of a run inherits
DEVICES = ("cpu", "cuda")  # where a run's workers compute (compat.cpu.device_choice decides)


class PrecisionError(ValueError):
    """A precision setting that is not one of ``CHOICES``."""


def _check_device(device, hint: str = "") -> None:
    if device not in DEVICES:
        raise ValueError(f"device={device!r}: expected one of {', '.join(DEVICES)}{hint}")


def cpu_native_bf16() -> bool:
    """Whether oneDNN has bf16 kernels for this CPU (under ``ONEDNN_MAX_CPU_ISA`` when set)."""
    import torch

    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def torch_cpu_capability() -> str:
    """ATen's CPU kernel level ("AVX512", "AVX2", "DEFAULT", ...), under ``ATEN_CPU_CAPABILITY``."""
    import torch

    return str(torch.backends.cpu.get_cpu_capability())


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo (lscpu's "Model name") gives it; else what platform knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def resolve(value: str | None = None, native_bf16: bool | None = None, name: str = ENV) -> str:
    """The CPU precision, "bf16" or "fp32".

    value: "auto" | "bf16" | "fp32" (any case; empty = auto); None reads ``OPENRLHF_DPPO_CPU_PRECISION``.
    native_bf16: what the CPU supports; None asks torch (``cpu_native_bf16``), only when needed.
    name: the variable or flag ``value`` came from, named in the error a bad value raises.
    """
    if value is None:
        value, name = os.environ.get(ENV, ""), ENV
    choice = value.strip().lower() or AUTO
    if choice not in CHOICES:
        raise PrecisionError(f"{name}={value!r}: expected one of {', '.join(CHOICES)}")
    if choice != AUTO:
        return choice
    return "bf16" if (cpu_native_bf16() if native_bf16 is None else native_bf16) else "fp32"


def isa_caps() -> dict[str, str]:
    """The instruction-set caps set in this environment (e.g. an emulated AVX2-only CPU)."""
    return {k: os.environ[k] for k in ISA_CAPS if os.environ.get(k)}


def _user() -> str:
    """The user part of Inductor's folder names, as torch's: the login name, else ``uid_<N>``."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        return f"uid_{os.getuid()}"


def torch_default_folder() -> str:
    """Inductor's own default folder, ``<tmp>/torchinductor_<user>``: shared by every environment of the user."""
    import re
    import tempfile

    return os.path.join(tempfile.gettempdir(), re.sub(r'[\\/:*?"<>|]', "_", f"torchinductor_{_user()}"))


def inductor_cache_folder(cap: str = "") -> str:
    """The kernel-cache folder of this Python environment: ``<tmp>/torchinductor_<user>_env-<key>``,
    ``<key>`` a digest of ``sys.prefix`` and torch's install folder (torch not imported); ``cap`` (an
    ``ATEN_CPU_CAPABILITY`` value) adds ``_aten-<cap>``."""
    import hashlib
    import importlib.util
    import re
    import tempfile

    spec = importlib.util.find_spec("torch")
    torch_dir = os.path.dirname(spec.origin) if spec is not None and spec.origin else ""
    key = hashlib.sha256(f"{sys.prefix}\n{torch_dir}".encode()).hexdigest()[:12]
    name = f"torchinductor_{_user()}_env-{key}" + (f"_aten-{cap}" if cap else "")
    return os.path.join(tempfile.gettempdir(), re.sub(r"[^A-Za-z0-9_.-]", "_", name))


def separate_inductor_cache(environ=None) -> str:
    """Give torch.compile's kernel cache a folder of this environment (and ISA cap) unless one is given
    (docs/CPU.md). A ``TORCHINDUCTOR_CACHE_DIR`` the user set is kept (torch's default folder counts as
    unset); otherwise it becomes ``inductor_cache_folder(cap)``, recorded in
    ``OPENRLHF_DPPO_INDUCTOR_CACHE``. ``TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS`` defaults to 0.
    environ: the mapping to read and set (None: ``os.environ``). Returns the folder in force.
    """
    env = os.environ if environ is None else environ
    env.setdefault(INDUCTOR_PCH, "0")
    config: Any = sys.modules.get("torch._inductor.config")
    if environ is None and config is not None:  # read at its import: too late for the variable
        config.cpp_cache_precompile_headers = env[INDUCTOR_PCH] == "1"
    given = env.get(INDUCTOR_CACHE)
    if given and given != env.get(INDUCTOR_CACHE_OURS) and os.path.abspath(given) != torch_default_folder():
        return given
    folder = inductor_cache_folder(env.get("ATEN_CPU_CAPABILITY", "").strip().lower())
    env[INDUCTOR_CACHE] = env[INDUCTOR_CACHE_OURS] = folder
    return folder


def describe(precision: str) -> str:
    """One line for the start of a run: the precision and the CPU facts it was chosen from."""
    caps = isa_caps()
    cap_note = f", capped by {' '.join(f'{k}={v}' for k, v in caps.items())}" if caps else ""
    bf16 = "native bf16" if cpu_native_bf16() else "no native bf16"
    return (
        f"CPU precision {precision} ({ENV}={os.environ.get(ENV) or AUTO}; {FLAG} wins when given): "
        f"{cpu_model()}, {bf16} (oneDNN), torch CPU capability {torch_cpu_capability()}{cap_note}"
    )


def machine(precision: str, device: str | None) -> dict:
    """The run directory's machine record (``run_dir.MACHINE``): this process's CPU facts, ``device``
    ("cpu" | "cuda", where the workers compute; anything else: ValueError) and ``precision`` (the run's
    ``--ds.param_dtype``)."""
    _check_device(device, " (RunMeta.device, set by the CLI)")
    return {
        run_dir.MACHINE_CPU_MODEL: cpu_model(),
        run_dir.MACHINE_CPU_NATIVE_BF16: cpu_native_bf16(),
        run_dir.MACHINE_TORCH_CPU_CAPABILITY: torch_cpu_capability(),
        run_dir.MACHINE_DEVICE: device,
        run_dir.MACHINE_PRECISION: precision,
        run_dir.MACHINE_ISA_CAPS: isa_caps(),
    }


@dataclass(frozen=True)
class ParamDtype:
    """``--ds.param_dtype`` as OpenRLHF declares it (its default and choices), read by ``prepare_parser``."""

    default: str
    choices: tuple[str, ...]

    def settle(self, value: str | None, device: str) -> str:
        """The flag's value once the run's device is known, for a parser prepared without it (value None:
        not given). On CPU: the value, else the CPU's choice (``resolve``); on CUDA: OpenRLHF's rule (its
        default, and only its choices). Raises PrecisionError naming the flag or the variable."""
        _check_device(device)
        if device == "cpu":
            return resolve() if value is None else value
        if value is None:
            return self.default
        if value not in self.choices:
            raise PrecisionError(
                f"{FLAG} {value}: this is a CUDA run, where OpenRLHF takes {' or '.join(self.choices)} "
                f"({value} is for a CPU run)"
            )
        return value


def prepare_parser(parser: argparse.ArgumentParser, device: str | None) -> ParamDtype:
    """On a CPU run: ``--ds.param_dtype`` also takes fp32, and its default is the CPU's choice (``resolve``).

    device: "cpu" | "cuda", where the run's workers compute (``compat.cpu.decide()``); a CUDA run's flag
    is left as OpenRLHF has it. None: not known yet (the CLI asks the cluster at ``RAY_ADDRESS`` once
    the command line is valid): fp32 is taken and the default left None, for ``ParamDtype.settle``.
    A bad ``OPENRLHF_DPPO_CPU_PRECISION`` exits with status 2. Returns the flag as OpenRLHF declared it.
    """
    if device is not None:
        _check_device(device)
    action = next((a for a in parser._actions if a.dest == FLAG_DEST), None)
    if action is None:
        raise RuntimeError(f"OpenRLHF's parser has no {FLAG}: another OpenRLHF version?")
    host = ParamDtype(action.default, tuple(action.choices or ()))
    if device == "cuda":
        return host
    try:
        action.default = resolve() if device == "cpu" else None
    except PrecisionError as err:
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    action.choices = [*host.choices, *(c for c in TORCH_DTYPES if c not in host.choices)]
    return host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m openrlhf_dppo.precision", description=__doc__.split("\n")[0]
    )
    parser.add_argument("value", nargs="?", help=f"{'|'.join(CHOICES)} (default: ${ENV}, else auto)")
    parser.add_argument("--name", default=None, help="the variable a bad value is reported under")
    parser.add_argument("--explain", action="store_true", help="also print why, on stderr")
    ns = parser.parse_args(argv)
    try:
        value = resolve(ns.value, name=ns.name or "precision") if ns.value is not None else resolve()
    except ModuleNotFoundError as err:  # auto asks torch
        print(f"error: choosing the CPU precision needs torch in {sys.executable} ({err})", file=sys.stderr)
        return 2
    except PrecisionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(value)
    if ns.explain:
        print(describe(value), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
