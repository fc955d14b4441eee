"""Completion keep-probability policies (METHOD.md, "Level 2"): one module per policy, in this folder.

A policy module defines
- ``NAME``: the ``--dppo.completion_policy`` value;
- ``HELP``: one line on what it does (the flag's ``--help``, the README's flag table and the docs show it);
- ``keep_probs(absA, zero, valid, p_min, budget) -> (p, status)``, rows independent:
    absA: (R, N) float64 |A| of the full-group advantages;
    zero: (R, N) bool, items that get p = 0 (A == 0 exactly and the loss gives them no gradient);
    valid: (R, N) bool, items that exist (the others get p = 0);
    p_min: the floor of every other valid item; budget: (R,) float64, the expected kept count to reach;
    p: (R, N) float64 in [0, 1], p >= p_min on valid & ~zero, 0 elsewhere, never smaller for a larger |A|;
    status: (R,) int64 as ``solve_clipped_scale``'s (0 met, 1 floors above the budget, 2 budget above
    what the items can carry).
  Its module docstring says what the policy is and where it departs from the paper.

``COMPLETION_POLICIES`` holds every module of this folder (not starting with "_"), in name order: adding
a policy is adding its module and its test (``tests/core/policies/test_<module>.py``); the config, the
flags, the README table, the generic property tests and the unbiasedness Monte-Carlo test pick it up
from the registry. Importing this package imports its modules and changes nothing outside it.
"""

from __future__ import annotations

from openrlhf_dppo.core.registry import Registry

COMPLETION_POLICIES = Registry("completion keep-probability policy")

COMPLETION_POLICIES.add_modules(__name__, __path__)
