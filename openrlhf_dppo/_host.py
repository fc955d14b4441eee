"""The one OpenRLHF version this extension is written against (any other is refused), and how the host
is prepared: ``prepare_host()`` (called by the entry points, never on import) checks it and installs the
flash-attn stand-in where flash-attn is missing. ``OPENRLHF_DPPO_SKIP_VERSION_CHECK=1`` skips the check.
"""

from __future__ import annotations

import os
from importlib import metadata

REQUIRED_OPENRLHF = "0.11.2"


class OpenRLHFVersionError(ImportError):
    """The installed OpenRLHF is not the version openrlhf-dppo extends."""


def installed_openrlhf_version() -> str | None:
    try:
        return metadata.version("openrlhf")
    except metadata.PackageNotFoundError:
        return None


def check_openrlhf_version(installed: str | None = None) -> str:
    """Return the installed OpenRLHF version; raise OpenRLHFVersionError unless it is 0.11.2."""
    version = installed_openrlhf_version() if installed is None else installed
    if version is None:
        raise OpenRLHFVersionError(
            f"openrlhf-dppo requires OpenRLHF {REQUIRED_OPENRLHF}, but OpenRLHF is not installed. "
            f"GPU: bash scripts/setup_gpu.sh   CPU: bash scripts/setup_cpu.sh"
        )
    if version != REQUIRED_OPENRLHF:
        raise OpenRLHFVersionError(
            f"openrlhf-dppo requires OpenRLHF {REQUIRED_OPENRLHF}, but OpenRLHF {version} is installed. "
            f"Install the pinned version: pip install openrlhf=={REQUIRED_OPENRLHF}"
        )
    return version


def guard_version() -> str | None:
    """``check_openrlhf_version()`` unless the environment skips it; the installed version or None."""
    if os.environ.get("OPENRLHF_DPPO_SKIP_VERSION_CHECK") == "1":
        return None
    return check_openrlhf_version()


def prepare_host() -> str | None:
    """Check the OpenRLHF version and install the flash-attn stand-in when needed. Idempotent. Returns
    the installed OpenRLHF version (None when the check is skipped)."""
    from openrlhf_dppo.compat import flash_attn_stub

    version = guard_version()
    flash_attn_stub.install()
    return version
