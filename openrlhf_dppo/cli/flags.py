"""The ``--dppo.*`` flags, generated from the fields that define them (each fact written once).

Two dataclasses hold every flag: ``DPPOConfig`` (the method, ``openrlhf_dppo.core.config``) and
``RunOptions`` below (how this run is driven, not part of the method). A field's type, default, help
and choices (read from the registries) make its flag; ``--help``, the README table
(``openrlhf_dppo.cli.flags_table``) and the validation all come from here. Imports no host module.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass

from openrlhf_dppo.core.config import MODE_PRESETS, DPPOConfig, DPPOConfigError, field_choices, option

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
        "stop after this many training steps (DPPO and --dppo.enable false alike), >= 1; if "
        "--train.num_episodes runs out first the run ends there with a warning in status.json; unset: "
        "OpenRLHF's episodes and epochs decide",
        default_text="unset",
    )
    schedule_steps: int | None = option(
        None,
        "the training steps the LR schedule spans, at least the run's (>= --dppo.max_steps): a run cut "
        "short at --dppo.max_steps follows the schedule of a longer one (e.g. a slow baseline stopped "
        "early, for time); unset: --dppo.max_steps, or OpenRLHF's episodes and epochs",
        default_text="--dppo.max_steps",
    )

    def __post_init__(self) -> None:
        if self.run_dir is not None and (not isinstance(self.run_dir, str) or not self.run_dir.strip()):
            raise DPPOConfigError("run_dir", self.run_dir, "must be a non-empty path")
        for name in ("max_steps", "schedule_steps"):
            steps = getattr(self, name)
            if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
                raise DPPOConfigError(name, steps, "must be an integer >= 1 (training steps)")
        if (
            self.max_steps is not None
            and self.schedule_steps is not None
            and self.schedule_steps < self.max_steps
        ):
            raise DPPOConfigError(
                "schedule_steps",
                self.schedule_steps,
                f"must be >= --dppo.max_steps ({self.max_steps}): the schedule would end before the run",
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


MODE_FLAG = "--dppo.mode"
_NOT_GIVEN = object()  # the default a flag holds while parse_given finds out whether it was given


def preset_fields() -> list[str]:
    """Every field some ``--dppo.mode`` preset sets (``core.config.MODE_PRESETS``)."""
    return list(dict.fromkeys(k for preset in MODE_PRESETS.values() for k in preset))


def parse_given(
    parser: argparse.ArgumentParser, argv: list[str], names: list[str]
) -> tuple[argparse.Namespace, set[str]]:
    """``parser.parse_args(argv)`` and which of the ``--dppo.<name>`` flags in ``names`` the command line
    gave, as argparse read it: abbreviated (OpenRLHF's parser allows abbreviations), ``--flag=value``, in
    any order, even at the default's value. The namespace holds the defaults of the others."""
    actions = [a for a in parser._actions if a.dest in {f"dppo.{n}" for n in names}]
    defaults = {a.dest: a.default for a in actions}
    for action in actions:
        action.default = _NOT_GIVEN
    try:
        ns = parser.parse_args(argv)
    finally:
        for action in actions:
            action.default = defaults[action.dest]
    given = set()
    for dest, default in defaults.items():
        if getattr(ns, dest) is _NOT_GIVEN:
            setattr(ns, dest, default)
        else:
            given.add(dest[len("dppo.") :])
    return ns, given


@dataclass(frozen=True)
class ModeChoice:
    """What ``--dppo.mode NAME`` set (``apply_mode``): ``applied`` field -> value, the fields the command line
    gave itself (``kept``), the preset's values its other flags refuse (``left_out``: field -> the refusal),
    ``inert`` under ``--dppo.enable false`` (GRPO: the preset sets nothing)."""

    name: str
    applied: dict[str, object]
    kept: tuple[str, ...] = ()
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    inert: bool = False

    def flags(self) -> list[str]:
        """The applied values as flags (run_config.json's argv records them in front of the command line)."""
        return [w for k, v in self.applied.items() for w in (f"--dppo.{k}", str(v))]

    def note(self) -> str:
        """The start-up line: what the preset set, what it did not, and why."""
        head = f"{MODE_FLAG} {self.name}: "
        if self.inert:
            return head + "nothing set: --dppo.enable false runs GRPO, which the preset's flags do not change"
        note = head + (", ".join(f"--dppo.{k} {v}" for k, v in self.applied.items()) or "nothing")
        if self.kept:
            note += f" (the command line's own {', '.join(f'--dppo.{k}' for k in self.kept)} kept)"
        for k, why in self.left_out.items():
            note += f"; --dppo.{k} {MODE_PRESETS[self.name][k]} left out (the field's default kept): {why}"
        return note


def apply_mode(
    flags: dict, given: set[str], refusal: typing.Callable[[dict], str | None]
) -> tuple[dict, ModeChoice | None]:
    """The parsed flat namespace's dict with ``--dppo.mode``'s preset applied, and what it set (None: no
    preset). The rule (the mode's help): the preset sets only the fields the command line did not give
    (``given``, from ``parse_given``), in the preset's order, and a value that would make ``refusal`` refuse
    the command (a message; None: accepted) is left out, the field keeping its default: a preset never
    makes the command line's own flags fail. Nothing is set where the command alone is refused (its own
    error is the one to report) nor under ``--dppo.enable false``."""
    name = flags.get("dppo.mode")
    preset = MODE_PRESETS.get(name or "") or {}
    if not preset:
        return flags, None
    kept = tuple(k for k in preset if k in given)
    if not flags.get("dppo.enable", True):
        return flags, ModeChoice(name, {}, kept, inert=True)
    out, applied, left_out = dict(flags), {}, {}
    if refusal(out) is None:
        for k, v in preset.items():
            if k in given:
                continue
            trial = {**out, f"dppo.{k}": v}
            why = refusal(trial)
            if why is None:
                out, applied[k] = trial, v
            else:
                left_out[k] = why
    return out, ModeChoice(name, applied, kept, left_out)
