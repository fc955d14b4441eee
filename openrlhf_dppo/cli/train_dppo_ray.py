"""`python -m openrlhf_dppo.cli.train_dppo_ray <OpenRLHF flags> --dppo.*`: DPPO on OpenRLHF's Ray pipeline.

A user's GRPO command becomes DPPO by swapping the module name and adding ``--dppo.*`` flags.
OpenRLHF 0.11.2 builds its parser and validates its arguments inside the ``if __name__ ==
"__main__":`` block of ``openrlhf/cli/train_ppo_ray.py``. To run THAT parser and THAT validation (not
a copy), this module loads the script's source, checks its shape with ``ast`` and rewrites two
statements of the main block:

1. ``args = parser.parse_args()``  ->  ``args = __dppo_parse_args__(parser)``: adds the ``DPPO``
   argument group (``--help`` lists it), parses, and -- when DPPO is on -- turns on
   ``--train.dynamic_batch_enable`` (DPPO trains through the packing path) before OpenRLHF's own
   validation runs (which then sets ``--ds.packing_samples`` and the rollout token budget);
2. the final ``train(args)``  ->  ``__dppo_train__(args)``: builds the frozen ``DPPOConfig``
   (a bad value fails with the flag's name), rejects incompatible combinations -- all before Ray
   starts -- installs the DPPO classes (``openrlhf_dppo.adapters.install``) and calls OpenRLHF's real
   ``train``.

If the script does not have the expected shape (another OpenRLHF version), this fails loudly.
``--dppo.enable false`` installs only the run-directory writer: every number is OpenRLHF's GRPO.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import sys
import time
from types import SimpleNamespace
from typing import Callable, Sequence

OPENRLHF_SCRIPT = "openrlhf.cli.train_ppo_ray"
PARSE_HOOK = "__dppo_parse_args__"
TRAIN_HOOK = "__dppo_train__"


def _bool(text: str) -> bool:
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


# name -> (type, choices, help). Defaults come from DPPOConfig (one source of truth).
FLAG_SPECS: dict[str, tuple] = {
    "enable": (
        _bool,
        None,
        "true: DPPO; false: exactly OpenRLHF's GRPO run (only the metrics files are added)",
    ),
    "prompt_prune_rate": (
        float,
        None,
        "target fraction r_q of drawn prompts pruned before rollout, in [0, 1)",
    ),
    "completion_prune_rate": (
        float,
        None,
        "target fraction r_o of rolled-out completions pruned before the actor/reference forwards, in [0, 1)",
    ),
    "completion_policy": (
        str,
        ("uniform-low", "proportional"),
        "completion keep probabilities: uniform-low (|A| below the batch mean pruned at one rate) or "
        "proportional (p ~ |A|)",
    ),
    "q_min": (float, None, "floor of every prompt keep probability (> 0 keeps the estimator unbiased)"),
    "p_min": (float, None, "floor of every completion keep probability whose gradient may be non-zero"),
    "sampling": (
        str,
        ("bernoulli", "systematic"),
        "sampling design of the keep masks: systematic fixes the kept count (a multiple of the DP size "
        "for completions), bernoulli draws independently",
    ),
    "packer": (
        str,
        ("window", "ffd", "openrlhf"),
        "micro-batch packer under --train.max_tokens_per_gpu: window (window-based greedy best fit), ffd "
        "(first-fit decreasing) or openrlhf (OpenRLHF's own balanced partitions, for comparison)",
    ),
    "pack_window": (int, None, "number of open buffers of the window packer"),
    "seed": (int, None, "seed of the pruning draws (each step draws from (seed, step))"),
    "history_decay": (float, None, "EMA decay of the per-prompt success / reward statistics"),
    "history_prior": (float, None, "prior pseudo-count of the per-prompt success estimate"),
    "reward_kind": (
        str,
        ("auto", "binary", "continuous"),
        "prompt score: binary rewards use P(G samples not all equal), continuous the reward std; auto "
        "decides from the rewards seen",
    ),
    "prompt_batch": (
        str,
        ("shrink", "refill"),
        "shrink: a step rolls out the kept prompts only (a smaller step); refill: draw "
        "floor(B / (1 - r_q)) prompts so that about B are rolled out (needs --dppo.sampling systematic)",
    ),
    "drop_zero_advantage": (
        _bool,
        None,
        "drop completions with A == 0 exactly (p = 0, exact and free) when the loss has no KL or entropy term",
    ),
    "token_normalizer": (
        str,
        ("ht", "constant"),
        "token-mean normaliser Z: ht (Horvitz-Thompson estimate of the full batch's tokens) or constant "
        "(B * G * max_new_tokens, Dr.GRPO style, exactly unbiased)",
    ),
}
#: flags that are not DPPOConfig fields
EXTRA_FLAGS = {
    "run_dir": (
        str,
        None,
        "directory of run_config.json / metrics.jsonl / status.json (default: --ckpt.output_dir)",
    ),
}


class DPPOArgumentError(ValueError):
    """A --dppo.* value or a flag combination DPPO cannot run with; the message names the flag."""


def _config_cls():
    from openrlhf_dppo.adapters import packing  # noqa: F401  (registers the "openrlhf" packer)
    from openrlhf_dppo.core import DPPOConfig

    return DPPOConfig


def add_dppo_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``DPPO`` group (``--dppo.<field>``, dotted like OpenRLHF's flags) to ``parser``."""
    group = parser.add_argument_group("DPPO", "Dynamic Pruning Policy Optimization (openrlhf-dppo)")
    defaults = {f.name: f.default for f in dataclasses.fields(_config_cls())}
    missing = sorted(set(defaults) - set(FLAG_SPECS))
    if missing:  # a config field without a flag would silently keep its default
        raise RuntimeError(f"DPPOConfig fields without a --dppo flag: {missing}")
    specs = {name: (*spec, defaults.get(name)) for name, spec in FLAG_SPECS.items() if name in defaults}
    specs.update({name: (*spec, None) for name, spec in EXTRA_FLAGS.items()})
    for name, (typ, choices, help_text, default) in specs.items():
        shown = "" if default is None else f" (default: {default})"
        group.add_argument(
            f"--dppo.{name}",
            type=typ,
            choices=choices,
            default=default,
            metavar=None if choices else name.upper(),
            help=help_text + shown,
        )
    return parser


def build_config(args):
    """The frozen DPPOConfig from ``args.dppo`` (hierarchized). Raises DPPOArgumentError naming the flag."""
    cls = _config_cls()
    fields = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in vars(args.dppo).items() if k in fields}
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        msg = str(err)
        named = [f for f in sorted(fields, key=len, reverse=True) if f in msg]
        flag = f"--dppo.{named[0]}" if named else "--dppo"
        raise DPPOArgumentError(f"{flag}: {msg}") from err


def check_compatibility(args, cfg) -> None:
    """Reject flag combinations the DPPO pipeline cannot run, with the reason (before Ray starts)."""
    if args.train.async_enable:
        raise DPPOArgumentError(
            "--train.async_enable: not supported by train_dppo_ray. The async trainer generates batch k+1 "
            "while batch k trains, so the prompt keep probabilities would come from a stale history and its "
            "trainer has other seams; run synchronously (the GRPO baseline too, so the two are comparable)."
        )
    if not cfg.enable:
        return
    est = args.algo.advantage.estimator
    if est == "gae":
        raise DPPOArgumentError(
            "--algo.advantage.estimator gae: DPPO prunes whole completions by their group advantage and "
            "skips their forward passes; a critic (GAE) needs every sequence. Use group_norm or dr_grpo."
        )
    if est not in ("group_norm", "dr_grpo"):
        raise DPPOArgumentError(
            f"--algo.advantage.estimator {est}: DPPO computes advantages on the full groups "
            "(core.group_advantages) and needs a group estimator: group_norm or dr_grpo."
        )
    if not args.reward.remote_url:
        raise DPPOArgumentError(
            "--reward.remote_url: DPPO needs the rewards on the rollouts (to compute advantages before the "
            "forward passes it skips). Pass --reward.remote_url <reward function file or URL> or "
            "--train.agent_func_path; a reward model (--reward.model_name_or_path) scores too late."
        )
    if args.rollout.n_samples_per_prompt < 2:
        raise DPPOArgumentError("--rollout.n_samples_per_prompt: DPPO needs groups of at least 2 completions")
    if getattr(args.data, "max_images_per_prompt", 0) > 0:
        raise DPPOArgumentError(
            "--data.max_images_per_prompt: DPPO trains through packed micro-batches, which OpenRLHF 0.11.2 "
            "does not support for vision-language models."
        )
    if args.rollout.vllm_generate_batch_size != args.rollout.batch_size:
        raise DPPOArgumentError(
            "--rollout.vllm_generate_batch_size: DPPO prunes each step's drawn prompt batch; it must equal "
            "--rollout.batch_size."
        )
    if cfg.prompt_batch == "refill" and cfg.prompt_prune_rate > 0:
        if cfg.sampling != "systematic":
            raise DPPOArgumentError(
                "--dppo.prompt_batch refill: needs --dppo.sampling systematic (a fixed kept count keeps the "
                "rolled-out batch within --rollout.batch_size)."
            )
        if cfg.q_min > 1.0 - cfg.prompt_prune_rate:
            raise DPPOArgumentError(
                f"--dppo.q_min {cfg.q_min}: with --dppo.prompt_batch refill it must be <= 1 - "
                f"--dppo.prompt_prune_rate ({1.0 - cfg.prompt_prune_rate:g})."
            )
    if not args.train.dynamic_batch_enable:  # set by the parse hook; only reachable if something undid it
        raise DPPOArgumentError("--train.dynamic_batch_enable: DPPO trains through OpenRLHF's packing path")


def _load_openrlhf_main(path: str | None = None) -> tuple[str, ast.Module]:
    """Source path and the rewritten AST of OpenRLHF's train_ppo_ray script (see module docstring).

    path: the script to load (default: the installed ``openrlhf.cli.train_ppo_ray``).
    """
    from openrlhf_dppo._host import installed_openrlhf_version

    if path is None:
        spec = importlib.util.find_spec(OPENRLHF_SCRIPT)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"cannot find {OPENRLHF_SCRIPT}; is OpenRLHF installed?")
        path = spec.origin
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), filename=path)

    def fail(what: str):
        raise RuntimeError(
            f"{path} (OpenRLHF {installed_openrlhf_version()}) does not have the shape openrlhf-dppo "
            f"was written against (OpenRLHF 0.11.2): {what}"
        )

    mains = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
        and isinstance(node.test.comparators[0], ast.Constant)
        and node.test.comparators[0].value == "__main__"
    ]
    if len(mains) != 1:
        fail(f"expected one `if __name__ == '__main__':` block, found {len(mains)}")
    body = mains[0].body

    def is_parse(stmt) -> bool:
        return (
            isinstance(stmt, ast.Assign)
            and len(stmt.targets) == 1
            and isinstance(stmt.targets[0], ast.Name)
            and stmt.targets[0].id == "args"
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute)
            and stmt.value.func.attr == "parse_args"
            and isinstance(stmt.value.func.value, ast.Name)
            and stmt.value.func.value.id == "parser"
            and not stmt.value.args
            and not stmt.value.keywords
        )

    def is_train(stmt) -> bool:
        return (
            isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Name)
            and stmt.value.func.id == "train"
            and [a.id for a in stmt.value.args if isinstance(a, ast.Name)] == ["args"]
        )

    parses = [i for i, s in enumerate(body) if is_parse(s)]
    trains = [i for i, s in enumerate(body) if is_train(s)]
    if len(parses) != 1:
        fail(f"expected one `args = parser.parse_args()` in the main block, found {len(parses)}")
    if len(trains) != 1 or trains[0] != len(body) - 1:
        fail("expected the main block to end with `train(args)`")
    if parses[0] > trains[0]:
        fail("`train(args)` comes before `parser.parse_args()`")
    body[parses[0]].value = ast.Call(
        func=ast.Name(PARSE_HOOK, ast.Load()), args=[ast.Name("parser", ast.Load())], keywords=[]
    )
    body[trains[0]].value.func = ast.Name(TRAIN_HOOK, ast.Load())
    ast.fix_missing_locations(tree)
    return path, tree


def _apply_cpu_compat() -> None:
    import torch

    if torch.cuda.is_available():
        return
    try:
        from openrlhf_dppo.compat import cpu
    except ModuleNotFoundError as err:  # tolerated only while the CPU layer itself is absent
        if err.name != "openrlhf_dppo.compat.cpu":
            raise
        return
    cpu.apply()


def main(argv: Sequence[str] | None = None, train_fn: Callable | None = None):
    """Run OpenRLHF's train_ppo_ray main block with the DPPO hooks.

    argv: the command line without the program name (default ``sys.argv[1:]``).
    train_fn: what to call with the validated args (default: install DPPO, then OpenRLHF's ``train``);
      tests pass a function that captures the namespace and stops before Ray.
    Returns what ``train_fn`` returns.
    """
    if train_fn is None:  # a real run: the CPU layer (a no-op with CUDA) goes in before anything else
        _apply_cpu_compat()
    from openrlhf_dppo._host import prepare_host

    prepare_host()  # OpenRLHF 0.11.2 or a clear error; the flash-attn stand-in where flash-attn is missing
    argv = list(sys.argv[1:] if argv is None else argv)
    # `--config X.yaml` expands in place into the flags the YAML holds (openrlhf_dppo.recipe), so scripts,
    # Slurm and configs launch through the same parser.
    from openrlhf_dppo.recipe import ConfigError, expand_argv

    try:
        argv = expand_argv(argv)
    except ConfigError as err:
        raise SystemExit(f"train_dppo_ray: --config: {err}") from err
    origin, tree = _load_openrlhf_main()
    state = SimpleNamespace(parser=None, result=None)

    def parse_hook(parser: argparse.ArgumentParser):
        state.parser = parser
        add_dppo_arguments(parser)
        ns = parser.parse_args(argv)
        if getattr(ns, "dppo.enable") and not getattr(ns, "train.dynamic_batch_enable"):
            print("[openrlhf-dppo] DPPO trains packed micro-batches: turning on --train.dynamic_batch_enable")
            setattr(ns, "train.dynamic_batch_enable", True)
        return ns

    def train_hook(args):
        try:
            cfg = build_config(args)
            check_compatibility(args, cfg)
        except DPPOArgumentError as err:
            state.parser.error(str(err))
        args.dppo_meta = SimpleNamespace(argv=list(argv), start_time=time.time())
        if train_fn is not None:
            state.result = train_fn(args)
            return
        from openrlhf.cli import train_ppo_ray

        from openrlhf_dppo.adapters import install

        install(cfg)
        state.result = train_ppo_ray.train(args)

    namespace = {"__name__": "__main__", "__file__": origin, PARSE_HOOK: parse_hook, TRAIN_HOOK: train_hook}
    exec(compile(tree, origin, "exec"), namespace)
    return state.result


if __name__ == "__main__":
    main()
