"""CLI tests: make the shared command lines (``cli_commands``) importable (tests/ is not a package)."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
