"""The ``--dppo.*`` flags, generated from the fields that define them (each fact written once).

Two dataclasses hold every flag: ``DPPOConfig`` (the method, ``openrlhf_dppo.core.config``) and
``RunOptions`` below (how this run is driven, not part of the method). A field's type, default, help
and choices make its flag; ``--help``, the flag table of docs/FLAGS.md (``scripts/flags_table.py``)
and the validation all come from here. Imports no host module.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass

from openrlhf_dppo.core.config import DPPOConfig, DPPOConfigError, field_choices, option

GROUP_TITLE = "DPPO"
GROUP_DESCRIPTION = "Dynamic Pruning Policy Optimization (openrlhf-dppo)"


@dataclass(frozen=True)
class RunOptions:
    """Run options given as ``--dppo.*`` flags that are not settings of the method."""

    run_dir: str | None = option(
        None,
        "directory of run_config.json, metrics.jsonl (one line per step and per evaluation) and status.json",
        default_text="--ckpt.output_dir",
    )
    max_steps: int | None = option(
        None,
        "stop after this many training steps (both arms), >= 1; if --train.num_episodes runs out first the "
        "run ends there with a warning in status.json; unset: OpenRLHF's episodes and epochs decide",
        default_text="unset",
    )
    schedule_steps: int | None = option(
        None,
        "the training steps the LR schedule spans, >= --dppo.max_steps (a run cut short follows the "
        "schedule of a longer one); unset: --dppo.max_steps, or OpenRLHF's episodes and epochs",
        default_text="--dppo.max_steps",
    )

    def __post_init__(self) -> None:
        if self.run_dir is not None and (not isinstance(self.run_dir, str) or not self.run_dir.strip()):
            raise DPPOConfigError("run_dir", self.run_dir, "expected a non-empty path")
        for name in ("max_steps", "schedule_steps"):
            steps = getattr(self, name)
            if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
                raise DPPOConfigError(name, steps, "expected an integer >= 1 (training steps)")
        if (
            self.max_steps is not None
            and self.schedule_steps is not None
            and self.schedule_steps < self.max_steps
        ):
            raise DPPOConfigError(
                "schedule_steps",
                self.schedule_steps,
                f"expected at least --dppo.max_steps ({self.max_steps}): the schedule would end before the run",
            )


#: the dataclasses whose fields are the --dppo.* flags, in --help / README order
FLAG_SOURCES = (DPPOConfig, RunOptions)


def parse_bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


_PARSERS = {bool: parse_bool, int: int, float: float, str: str}


@dataclass(frozen=True)
class FlagSpec:
    """One ``--dppo.<name>`` flag, derived from a field."""

    name: str
    parse: typing.Callable[[str], object]
    default: object
    help: str
    choices: list[str] | None
    default_text: str | None

    @property
    def flag(self) -> str:
        return f"--dppo.{self.name}"

    @property
    def shown_default(self) -> str:
        if self.default_text is not None:
            return self.default_text
        if isinstance(self.default, bool):
            return str(self.default).lower()
        return str(self.default)


def _value_type(annotation) -> type:
    """``float`` -> float; ``int | None`` -> int."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def flag_specs() -> list[FlagSpec]:
    """Every --dppo.* flag, in FLAG_SOURCES order. Raises if a field lacks help (it would be a flag
    nobody can read about) or has a type the command line cannot parse."""
    specs = []
    for cls in FLAG_SOURCES:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.metadata.get("help"):
                raise RuntimeError(f"{cls.__name__}.{f.name} has no help: declare it with option(...)")
            typ = _value_type(hints[f.name])
            if typ not in _PARSERS:
                raise RuntimeError(f"{cls.__name__}.{f.name}: no command-line parser for type {typ!r}")
            specs.append(
                FlagSpec(
                    f.name,
                    _PARSERS[typ],
                    f.default,
                    f.metadata["help"],
                    field_choices(f),
                    f.metadata["default_text"],
                )
            )
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise RuntimeError(
            f"a --dppo flag is declared twice: {sorted(n for n in names if names.count(n) > 1)}"
        )
    return specs


def add_dppo_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``DPPO`` group (``--dppo.<field>``, dotted like OpenRLHF's flags) to ``parser``."""
    group = parser.add_argument_group(GROUP_TITLE, GROUP_DESCRIPTION)
    for spec in flag_specs():
        group.add_argument(
            spec.flag,
            type=spec.parse,
            choices=spec.choices,
            default=spec.default,
            metavar=None if spec.choices else spec.name.upper(),
            help=f"{spec.help} (default: {spec.shown_default})".replace("%", "%%"),  # argparse formats help
        )
    return parser


def build_options(values: dict) -> tuple[DPPOConfig, RunOptions]:
    """(DPPOConfig, RunOptions) from ``{field: value}`` (the parsed --dppo.* values; other keys are
    ignored, missing ones take their defaults). Raises DPPOConfigError naming the field."""
    built = []
    for cls in FLAG_SOURCES:
        names = {f.name for f in dataclasses.fields(cls)}
        built.append(cls(**{k: v for k, v in values.items() if k in names}))
    return built[0], built[1]


def dppo_values_from_flags(flags: dict) -> dict:
    """The ``--dppo.*`` values of a flat (not yet hierarchized) namespace's dict, by field name."""
    prefix = "dppo."
    return {k[len(prefix) :]: v for k, v in flags.items() if k.startswith(prefix)}
