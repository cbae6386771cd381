"""How a forward pass runs: decided once, in ``PosMLP.forward``, and passed
down to the stem, the levels and the blocks.

There is one computation (block_pass.py); the mode only says how it is
recorded and checked:

* ``autograd``: autograd may record the pass (grad mode is on). The blocks
  then run the lean training Function (block_function.py) where their gate
  allows it, which keeps a third of the activations.
* ``graph``: a graph is being captured (``torch.compile``, ``torch.export``
  and so ``torch.onnx.export(dynamo=True)``, FX tracing). Input checks that
  would read tensor values are skipped. Nothing in the model branches on
  input sizes, so one captured graph holds at every size.

TorchScript tracing (``torch.jit.trace``, and the legacy
``torch.onnx.export(dynamo=False)`` built on it) records sizes as constants,
so its graph would only hold at the traced size: it is refused.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx


@dataclass(frozen=True)
class ForwardMode:
    autograd: bool
    graph: bool


class UnsupportedExportError(RuntimeError):
    """An exporter that would write a graph that is wrong at other sizes."""


TRACING_REFUSED = (
    'PosMLP cannot be captured by TorchScript tracing (torch.jit.trace, or '
    'torch.onnx.export(..., dynamo=False)): its window partition depends on '
    'the input size, which tracing records as constants, so the graph would '
    'only be right at the traced size. Use torch.onnx.export(model, (x,), '
    'path, dynamo=True, dynamic_shapes=...) or torch.export.export(...), or '
    'tools/export.py, which verifies the file in ONNX Runtime.')


def is_capturing_graph(x) -> bool:
    """True under torch.compile / torch.export (dynamo) and FX tracing."""
    return isinstance(x, torch.fx.Proxy) or torch.compiler.is_compiling()


def decide_forward_mode(x) -> ForwardMode:
    """The mode of a forward on ``x``. (Stochastic depth and BatchNorm
    follow the modules' ``training`` flag, whatever the mode.)"""
    if torch.jit.is_tracing():
        raise UnsupportedExportError(TRACING_REFUSED)
    return ForwardMode(autograd=torch.is_grad_enabled(),
                       graph=is_capturing_graph(x))
