"""A stand-in second device on CPU: within ``SecondDevice()``, "cuda" names a device that is not the CPU.

What it is for: code that runs on a GPU rank (the actor's training step, the replay buffer, the dispatch
plan, the weight folding) must not mix CPU tensors into CUDA ones. On a CPU-only machine every tensor is
a CPU tensor, so such a mix cannot fail a test. Inside the block:

1. ``x.to(0)``, ``x.to("cuda")``, ``x.cuda()``, ``Experience.to_device(torch.cuda.current_device())``
   and factories with ``device="cuda"`` (or an int) return ``OnDevice`` tensors: CPU memory, but
   ``.device`` is ``cuda:0`` and ``is_cuda`` is True. ``.cpu()`` / ``.to("cpu")`` return plain tensors.
2. An op's result is ``OnDevice`` when one of its tensor inputs is.
3. CUDA's device rules are enforced (the errors read as CUDA's, with the op's name added):
   - an op that mixes an ``OnDevice`` tensor with a CPU tensor of one or more dimensions raises;
   - a 0-dim CPU tensor is accepted as a scalar (as CUDA's elementwise kernels accept it), except by the
     ops that check every input's device (``STRICT``: stack, cat, ...), which raise;
   - indexing a CPU tensor with an ``OnDevice`` index raises (an ``OnDevice`` tensor indexed by a CPU
     index is fine, as on CUDA);
   - ``.numpy()`` / ``np.asarray`` of an ``OnDevice`` tensor raises;
   - copies between the devices (``copy_``, ``.to``, ``torch.as_tensor``, slice assignment) are allowed.
Where this departs from CUDA: the data stays on the CPU (``dist`` collectives over gloo see CPU tensors),
``torch.cuda.is_available()`` stays False, module parameters are not moved (``Module.to("cuda")`` is not
emulated), and the rules are those above, not every kernel's own check.

With ``DPPO_SECOND_DEVICE=cuda`` and a GPU present the fixture ``second_device`` (``tests/adapters/
conftest.py``) uses the real CUDA device instead, and these stand-ins are not used
(``benchmarks/gpu_smoke.sh`` runs the device tests that way).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("cuda", 0)

# Ops that check that every input is on one device (no CPU-scalar exception).
STRICT = {
    torch.stack, torch.cat, torch.concat, torch.concatenate, torch.hstack, torch.vstack, torch.dstack,
    torch.matmul, torch.mm, torch.bmm, torch.dot, torch.index_select, torch.gather, torch.take_along_dim,
    torch.Tensor.index_select, torch.Tensor.gather, torch.Tensor.masked_fill, torch.Tensor.masked_fill_,
    torch.Tensor.index_add_, torch.Tensor.scatter_, torch.Tensor.scatter_add_, torch.Tensor.__matmul__,
}  # fmt: skip
# Copies between the devices: allowed whatever the mix.
COPIES = {
    torch.Tensor.copy_, torch.Tensor.to, torch.as_tensor, torch.tensor, torch.Tensor.__setitem__,
    torch.Tensor.cpu, torch.Tensor.cuda, torch.Tensor.new_tensor,
}  # fmt: skip
INDEXING = {torch.Tensor.__getitem__}


class OnDevice(torch.Tensor):
    """A CPU tensor that ``SecondDevice`` treats as living on ``cuda:0`` (no behaviour of its own)."""

    __torch_function__ = torch._C._disabled_torch_function_impl


class DeviceMismatch(RuntimeError):
    """What CUDA raises for a mix of devices, raised by the stand-in."""


def _as(cls, t: torch.Tensor) -> torch.Tensor:
    """``t``'s data as a ``cls`` tensor: a leaf stays a leaf (same storage), anything else stays attached
    to the autograd graph."""
    if t.is_leaf:
        return torch.Tensor._make_subclass(cls, t, t.requires_grad)
    return t.as_subclass(cls)


def on_device(t: torch.Tensor) -> OnDevice:
    return t if isinstance(t, OnDevice) else _as(OnDevice, t)


def on_cpu(t: torch.Tensor) -> torch.Tensor:
    return _as(torch.Tensor, t) if isinstance(t, OnDevice) else t


def _is_cuda(device) -> bool | None:
    """True for a CUDA device spec, False for the CPU, None for anything that is not a device."""
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"the stand-in second device knows cpu and cuda, not {device}")
        return device.type == "cuda"
    return None


def _to_target(args, kwargs) -> bool | None:
    """``Tensor.to``'s device argument: True (cuda), False (cpu), None (keep)."""
    if "device" in kwargs:
        return _is_cuda(kwargs["device"])
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            return isinstance(a, OnDevice)
        found = _is_cuda(a) if not isinstance(a, torch.dtype) else None
        if found is not None:
            return found
    return None


def _drop_device(args, kwargs, func):
    """The call's arguments with the device spec replaced by the CPU."""
    kwargs = dict(kwargs)
    if "device" in kwargs:
        kwargs["device"] = "cpu"
    if func is torch.Tensor.to:
        kept = [args[0]]
        for a in args[1:]:
            if isinstance(a, torch.Tensor):
                kwargs.setdefault("dtype", a.dtype)
            elif isinstance(a, torch.dtype):
                kept.append(a)
            elif _is_cuda(a) is None:
                kept.append(a)
        args = tuple(kept)
    return args, kwargs


def _name(func) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))


def check_devices(func, args, kwargs) -> bool:
    """CUDA's device rules for one call (module docstring, rule 3); True when an input is ``OnDevice``."""
    flat, _ = tree_flatten((args, kwargs))
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    on = [t for t in tensors if isinstance(t, OnDevice)]
    cpu = [t for t in tensors if not isinstance(t, OnDevice)]
    if not on or not cpu or func in COPIES:
        return bool(on)
    if func in INDEXING:
        if not isinstance(args[0], OnDevice):
            raise DeviceMismatch(
                "indices should be either on cpu or on the same device as the indexed tensor (cpu) "
                f"[stand-in second device: {_name(func)}]"
            )
        return True
    if func in STRICT or any(t.dim() > 0 for t in cpu):
        raise DeviceMismatch(
            f"Expected all tensors to be on the same device, but found at least two devices, {DEVICE} and "
            f"cpu! [stand-in second device: {_name(func)}]"
        )
    return True


class SecondDevice(TorchFunctionMode):
    """The stand-in second device (module docstring), active within the ``with`` block."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor._make_subclass:  # nn.Parameter(...) of a plain tensor
            return func(*args, **kwargs)
        subject = args[0] if args else None
        if func in (torch.Tensor.device.__get__, torch.Tensor.is_cuda.__get__, torch.Tensor.get_device):
            if isinstance(subject, OnDevice):
                return {torch.Tensor.is_cuda.__get__: True, torch.Tensor.get_device: 0}.get(func, DEVICE)
            return func(*args, **kwargs)
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and isinstance(subject, OnDevice):
            raise DeviceMismatch(
                f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                "to host memory first. [stand-in second device]"
            )
        if func is torch.Tensor.cuda:
            target: bool | None = True
        elif func is torch.Tensor.cpu:
            target = False
        elif func is torch.Tensor.to:
            target = _to_target(args, kwargs)
        else:
            target = _is_cuda(kwargs["device"]) if kwargs.get("device") is not None else None
        inputs_on = check_devices(func, args, kwargs)
        call_args, call_kwargs = _drop_device(args, kwargs, func)
        if func is torch.Tensor.cuda:
            call_args, call_kwargs, func = call_args[:1], {}, torch.Tensor.clone
        # OnDevice has no __torch_function__ of its own and this mode is off inside this call: the op runs
        # as on plain CPU tensors, in place where it is in place
        out = func(*call_args, **call_kwargs)
        wrap = inputs_on if target is None else target
        if func is torch.Tensor.__setitem__ or out is None:
            return out
        return tree_map(
            lambda t: (on_device if wrap else on_cpu)(t) if isinstance(t, torch.Tensor) else t, out
        )
