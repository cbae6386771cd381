"""When the fast paths must call modules instead of reading their weights.

The blocks, the stem and the downsamplings compute with their modules'
parameters directly (a fused block pass, opaque training convolutions).
That skips what calling a module does besides its arithmetic. Tools reach
a backbone through exactly that: forward hooks and pre-hooks (feature
extraction, Grad-CAM, distillation, ``torch.nn.utils.prune`` and
``weight_norm``, which recompute the weight in a pre-hook), and modules
swapped for others (adapters such as peft's LoRA, parametrizations,
quantized layers). Where any of these is present the owner runs a path
that calls its modules, so whatever they do takes effect; elsewhere the
fast path runs, at the cost of this check.

Hooks registered for every module at once (``register_module_forward_hook``,
as torch's FlopCounterMode and ModuleTracker do) do not switch paths: they
observe the computation that runs, which is what a measurement is for.
"""
from __future__ import annotations

from typing import Tuple

from torch import nn


def has_hooks(module: nn.Module) -> bool:
    """``module`` has a forward, pre-forward or backward hook of its own."""
    return bool(module._forward_hooks or module._forward_pre_hooks
                or module._backward_hooks or module._backward_pre_hooks)


def must_call(*pairs: Tuple[nn.Module, type]) -> bool:
    """True where a fast path would skip a module's call: given (module,
    the class whose arithmetic the fast path reproduces) pairs, a module
    has a hook of its own, or is of another class than that (exactly: a
    subclass may compute something else)."""
    return any(type(module) is not kind or has_hooks(module)
               for module, kind in pairs)
