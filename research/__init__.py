"""Studies of run directories that no ``openrlhf-dppo`` command runs: not installed with the package.

Each study reads runs through the package's own report path (``openrlhf_dppo.report.load``) and runs from
the repository root as ``python -m research.<name> --help``; its tests are under ``research/tests``.

- ``research.lossless``: every arm's share of groups whose rewards are all equal, and the lossless limit
  of pruning (the training time an oracle that skipped exactly those groups would need), per seed and
  per half of each run;
- ``research.at_time``: every arm's held-out accuracy at fractions of the baseline's training time;
- ``research.curve_noise``: how much held-out accuracy moves between evaluations late in a run, against
  the standard error of the evaluated prompt set.

The package never imports this folder (``research/tests/test_layout.py``).
"""
