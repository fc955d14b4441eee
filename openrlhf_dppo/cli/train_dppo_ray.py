"""`python -m openrlhf_dppo.cli.train_dppo_ray <OpenRLHF flags> --dppo.*`: DPPO on OpenRLHF's Ray pipeline.

A user's GRPO command becomes DPPO by swapping the module name and adding ``--dppo.*`` flags. To run
OpenRLHF 0.11.2's own parser and validation (not a copy), this module runs the main block of
``openrlhf/cli/train_ppo_ray.py`` alone, with two statements replaced (each must read exactly so, else
this fails loudly): ``args = parser.parse_args()`` -> ``__dppo_parse_args__(parser)`` (adds the ``DPPO``
group, parses and validates DPPO's flags first: ``cli.validate``), and the final ``train(args)`` ->
``__dppo_train__(args)`` (decides the device, installs the CPU layer and ``adapters.install``, then calls
OpenRLHF's ``train``; Ray is first imported here). An AssertionError of OpenRLHF's validation becomes a
one-line error with status 2.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import sys
import time
from types import SimpleNamespace
from typing import Callable, Sequence

from openrlhf_dppo.cli.flags import add_dppo_arguments
from openrlhf_dppo.cli.validate import FlagError, limit_notices, validate
from openrlhf_dppo.compat import cpu
from openrlhf_dppo.precision import PrecisionError, machine, prepare_parser

OPENRLHF_SCRIPT = "openrlhf.cli.train_ppo_ray"
PARSE_HOOK = "__dppo_parse_args__"
TRAIN_HOOK = "__dppo_train__"
MAIN_TEST = "__name__ == '__main__'"
PARSE_STATEMENT = "args = parser.parse_args()"
TRAIN_STATEMENT = "train(args)"


def _load_openrlhf_main(path: str | None = None) -> tuple[str, ast.Module]:
    """Source path and a module holding the rewritten main block of OpenRLHF's train_ppo_ray script,
    preceded by the standard-library imports it uses (``ast`` checks that it needs nothing else of the
    script: the script's own imports, Ray among them, are not run).

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

    mains = [node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == MAIN_TEST]
    if len(mains) != 1:
        fail(f"expected one `if {MAIN_TEST}:` block, found {len(mains)}")
    main, body = mains[0], mains[0].body
    parses = [i for i, stmt in enumerate(body) if ast.unparse(stmt) == PARSE_STATEMENT]
    if len(parses) != 1:
        fail(f"expected one `{PARSE_STATEMENT}` in the main block, found {len(parses)}")
    if ast.unparse(body[-1]) != TRAIN_STATEMENT:
        fail(f"expected the main block to end with `{TRAIN_STATEMENT}`")
    body[parses[0]] = ast.copy_location(_statement(f"args = {PARSE_HOOK}(parser)"), body[parses[0]])
    body[-1] = ast.copy_location(_statement(f"{TRAIN_HOOK}(args)"), body[-1])
    imports = []
    for name in sorted(_free_names(main) - {PARSE_HOOK, TRAIN_HOOK}):
        binding = [stmt for stmt in tree.body if name in _imported_names(stmt)]
        modules = [_imported_module(stmt) for stmt in binding]
        if len(binding) != 1 or modules[0].split(".")[0] not in sys.stdlib_module_names:
            fail(f"the main block uses `{name}`, which is not bound by one standard-library import")
        imports.append(binding[0])
    module = ast.Module(body=imports + [main], type_ignores=[])
    ast.fix_missing_locations(module)
    return path, module


def _statement(source: str) -> ast.stmt:
    return ast.parse(source).body[0]


def _free_names(node: ast.AST) -> set[str]:
    """Names read in ``node`` that it neither assigns nor imports, nor are builtins."""
    loaded, bound = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            (loaded if isinstance(n.ctx, ast.Load) else bound).add(n.id)
        bound |= _imported_names(n)
    return loaded - bound - set(dir(builtins))


def _imported_names(stmt: ast.AST) -> set[str]:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {a.asname or a.name.split(".")[0] for a in stmt.names}
    return set()


def _imported_module(stmt: ast.AST) -> str:
    if isinstance(stmt, ast.ImportFrom):
        return "." if stmt.level else stmt.module or ""
    return stmt.names[0].name


def _apply_cpu_compat(args) -> None:
    """Install the CPU layer for a run the command line found to be a CPU run (``decide_locally()`` in the
    parse step or ``decide()`` in the train step: no CUDA on the driver, no GPU in the Ray cluster); every worker checks for itself again."""
    # as many stand-in GPUs as this run's groups ask for; the engine and weight sync in --ds.param_dtype
    choice = cpu.DeviceChoice(cpu.CPU, "decided by the command line (its line above says why)")
    cpu.apply(fake_gpus=cpu.stand_in_gpus(args), precision=args.ds.param_dtype, choice=choice)


def main(
    argv: Sequence[str] | None = None, train_fn: Callable | None = None, check_inputs: bool | None = None
):
    """Run OpenRLHF's train_ppo_ray main block with the DPPO hooks.

    argv: the command line without the program name (default ``sys.argv[1:]``).
    train_fn: what to call with the validated args (default: install DPPO, then OpenRLHF's ``train``);
      tests pass a function that captures the namespace and stops before Ray.
    check_inputs: look for the model, datasets, reward and agent files on this machine (default: for a
      real run, i.e. without ``train_fn``; tests parse command lines that name another machine's files).
    Returns what ``train_fn`` returns. Bad input exits with status 2 and a message naming the flag.
    """
    start_time = time.time()
    if check_inputs is None:
        check_inputs = train_fn is None
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
    state = SimpleNamespace(
        cfg=None, opts=None, result=None, parser=None, training=False, choice=None, dtype=None
    )

    def parse_hook(parser: argparse.ArgumentParser):
        state.parser = add_dppo_arguments(parser)
        try:  # where the workers compute, where nothing needs asking: the environment, the driver's CUDA
            state.choice = cpu.decide_locally()  # None: the cluster at RAY_ADDRESS is asked in train_hook
        except cpu.DeviceChoiceError as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        # on a CPU run: --ds.param_dtype takes fp32 and defaults to the CPU's choice (not known yet: settled
        # in train_hook)
        state.dtype = prepare_parser(parser, None if state.choice is None else state.choice.device)
        if any(a.split("=")[0] == "--dppo.enable" for a in argv):  # the flag --dppo.method replaced
            old = "--dppo.enable is now --dppo.method: grpo (was false) or dppo (true, the default)"
            parser.exit(2, f"{parser.prog}: error: {old}\n")
        ns = parser.parse_args(argv)
        flags = vars(ns)
        try:  # before OpenRLHF's validation, whose asserts would hide DPPO's reasons
            state.cfg, state.opts = validate(flags, check_inputs=check_inputs)
        except FlagError as err:  # the message alone: OpenRLHF's usage text runs to hundreds of lines
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        dppo = state.cfg.method in ("dppo", "cppo")  # DPPO's packed plan (CPPO trains through it too)
        for line in state.cfg.notices() + limit_notices(flags, dppo):
            print(f"[openrlhf-dppo] {line}")
        if dppo and not getattr(ns, "train.dynamic_batch_enable"):
            print("[openrlhf-dppo] DPPO trains packed micro-batches: turning on --train.dynamic_batch_enable")
            setattr(ns, "train.dynamic_batch_enable", True)
        return ns

    def train_hook(args):
        if state.choice is None:  # asked only now: --help and bad input never wait for a cluster
            try:
                state.choice = cpu.decide()
                args.ds.param_dtype = state.dtype.settle(args.ds.param_dtype, state.choice.device)
            except (cpu.DeviceChoiceError, PrecisionError) as err:
                state.parser.exit(2, f"{state.parser.prog}: error: {err}\n")
        state.training = True
        if train_fn is not None:
            state.result = train_fn(args)
            return
        print(f"[openrlhf-dppo] the workers compute on {state.choice.device}: {state.choice.why}")
        if state.choice.device == cpu.CPU:
            _apply_cpu_compat(args)  # before the host's Ray / DeepSpeed / vLLM modules load
        from openrlhf.cli import train_ppo_ray

        from openrlhf_dppo.adapters import install
        from openrlhf_dppo.run_dir import RunMeta

        opts, device = state.opts, state.choice.device
        run = RunMeta(
            argv=argv, start_time=start_time, run_dir=opts.run_dir, max_steps=opts.max_steps,
            schedule_steps=opts.schedule_steps, device=device, machine=machine(args.ds.param_dtype, device),
        )  # fmt: skip
        install(state.cfg, run)  # the config and run options validated above, passed as they are
        state.result = train_ppo_ray.train(args)

    namespace = {"__name__": "__main__", "__file__": origin, PARSE_HOOK: parse_hook, TRAIN_HOOK: train_hook}
    try:
        exec(compile(tree, origin, "exec"), namespace)
    except AssertionError as err:  # OpenRLHF's validation (validate() checks the known ones first)
        if state.parser is None or state.training:
            raise
        state.parser.exit(2, f"{state.parser.prog}: error: OpenRLHF refused the arguments: {err}\n")
    return state.result


if __name__ == "__main__":
    main()
