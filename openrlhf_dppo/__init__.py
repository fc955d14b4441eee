"""openrlhf-dppo: Dynamic Pruning Policy Optimization (DPPO) as an extension of OpenRLHF 0.11.2.

Importing the package (or ``openrlhf_dppo.core``, ``openrlhf_dppo.report``) changes nothing and needs
no OpenRLHF: the host is prepared (version guard + flash-attn stand-in, ``openrlhf_dppo._host.
prepare_host``) by the entry points that use it; ``openrlhf_dppo.adapters`` checks the version on import.
"""

from openrlhf_dppo._host import REQUIRED_OPENRLHF, OpenRLHFVersionError

__version__ = "0.1.0"
__all__ = ["REQUIRED_OPENRLHF", "OpenRLHFVersionError", "__version__"]
