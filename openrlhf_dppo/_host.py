"""The one OpenRLHF version this extension is written against, and how the host is prepared.

The adapters override single methods of OpenRLHF classes, whose contracts another version can change
silently, so any other version is refused. ``prepare_host()`` runs that check and, where flash-attn is
not installed, installs the pure-torch stand-in for the two flash-attn modules OpenRLHF imports
(``compat.flash_attn_stub``); the entry points that use the host call it, never an import. Importing
``openrlhf_dppo.adapters`` runs ``guard_version()`` only. ``OPENRLHF_DPPO_SKIP_VERSION_CHECK=1`` skips
the check (debugging only).
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
    """Check the OpenRLHF version and install the flash-attn stand-in when needed. Idempotent.

    Returns the installed OpenRLHF version (None when the check is skipped by the environment).
    """
    from openrlhf_dppo.compat import flash_attn_stub

    version = guard_version()
    flash_attn_stub.install()
    return version
