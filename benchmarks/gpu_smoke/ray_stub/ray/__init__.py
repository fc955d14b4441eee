"""Import stand-in for Ray, used by ``benchmarks/gpu_smoke.sh`` only.

The GPU smoke runs OpenRLHF's actor trainer in one process, without Ray actors, on a machine where
Ray is not installed (its wheel is too large to carry there). OpenRLHF's actor modules import ``ray``
at module level and decorate their actor classes with ``@ray.remote``; nothing on the smoke's path
calls Ray after that. So this package offers exactly that: ``remote`` returns the class or function
unchanged, and any other ``ray.<name>`` raises an AttributeError that names this stand-in.

The smoke script puts ``benchmarks/gpu_smoke/ray_stub`` on PYTHONPATH only when ``import ray`` fails
there; the package, the CLI and the tests never see it.
"""

STAND_IN = "benchmarks/gpu_smoke/ray_stub"


def remote(*args, **options):
    """``@ray.remote`` and ``@ray.remote(**options)``: the decorated object itself (no actor)."""
    if len(args) == 1 and not options and callable(args[0]):
        return args[0]
    if args:
        raise TypeError(f"ray stand-in: remote() takes a class or keyword options, got {args!r}")
    return lambda target: target


def __getattr__(name: str):
    raise AttributeError(
        f"ray.{name} is not in the GPU smoke's Ray stand-in ({STAND_IN}/ray): this code path needs the "
        "real Ray, which the smoke does not run"
    )
