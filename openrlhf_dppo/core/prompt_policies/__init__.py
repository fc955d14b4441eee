"""Prompt keep-probability policies (METHOD.md, "Level 1" and "Choosing q"): one module per policy, in
this folder.

A policy module defines
- ``NAME``: the ``--dppo.prompt_policy`` value;
- ``HELP``: one line on what it does (the flag's ``--help``, the flag table of docs/FLAGS.md);
- ``keep_probs(sig, valid, q_min, keep_frac) -> (q, status)``, rows independent:
    sig: a ``core.history.PromptSignals`` of (R, B) tensors (score, E[v], cost, unseen, pinned), made by
      ``PromptHistory.signals`` before the step's rollout;
    valid: (R, B) bool, prompts that exist (the others get q = 0);
    q_min: the floor of every valid prompt; keep_frac: the rate control's 1 - r_q, in (0, 1];
    q: (R, B) float64, q = 1 on pinned prompts, q in [q_min, 1] on the other valid ones, 0 elsewhere;
    status: (R,) int64 as ``solve_clipped_scale``'s (0 met, 1 floors above the budget, 2 budget above
      what the prompts can carry).
  Its module docstring says what the policy is, what budget it spends, and where it departs from the paper.

``PROMPT_POLICIES`` holds every module of this folder (not starting with "_"), in name order: adding a
policy is adding its module and its test (``tests/core/prompt_policies/test_<module>.py``); the config, the
flags, the flag table, the generic property tests and the unbiasedness Monte-Carlo test pick it up from
the registry. Importing this package imports its modules and changes nothing outside it.
"""

from __future__ import annotations

from openrlhf_dppo.core.registry import Registry

PROMPT_POLICIES = Registry("prompt keep-probability policy")

PROMPT_POLICIES.add_modules(__name__, __path__)
