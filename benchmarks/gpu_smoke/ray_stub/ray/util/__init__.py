"""``ray.util`` of the GPU smoke's Ray stand-in (see ``ray/__init__.py``): only the two modules that
OpenRLHF imports at module level."""


def __getattr__(name: str):
    raise AttributeError(f"ray.util.{name} is not in the GPU smoke's Ray stand-in: it needs the real Ray")
