"""How a forward pass runs: decided once, in ``PosMLP.forward``, and passed
down to the stem, the levels, the blocks and the gates.

* ``AUTOGRAD``: eager PyTorch whenever autograd may record the pass or the
  model is training (so stochastic depth follows ``self.training`` whatever
  the grad mode). Windows are cut at their real tokens (exact partial
  windows, no padding, see windows.py); every op is out of place.
* ``INFERENCE``: eager, eval mode, no autograd, no autocast. The same
  computation as AUTOGRAD, but the blocks overwrite their own intermediates
  and share scratch buffers (workspace.py): the fast path for CPU inference.
* ``GRAPH``: a graph is being captured: ``torch.compile``, ``torch.export``
  (and so ``torch.onnx.export(dynamo=True)``) or FX symbolic tracing. Input
  sizes may be symbolic, so nothing may depend on their concrete values: the
  map is padded to whole windows and the padded keys are masked out of the
  mixing (windows.PaddedWindows). The graph then holds at every input size.

TorchScript tracing (``torch.jit.trace``, and the legacy
``torch.onnx.export(dynamo=False)`` built on it) records sizes as constants,
so its graph would only hold at the traced size: it is refused.
"""
from __future__ import annotations

import enum

import torch
import torch.fx


class ForwardMode(enum.Enum):
    AUTOGRAD = 'autograd'
    INFERENCE = 'inference'
    GRAPH = 'graph'


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


def decide_forward_mode(x, training: bool) -> ForwardMode:
    if torch.jit.is_tracing():
        raise UnsupportedExportError(TRACING_REFUSED)
    if is_capturing_graph(x):
        return ForwardMode.GRAPH
    if training or torch.is_grad_enabled() or torch.is_autocast_enabled(
            x.device.type):
        # (autocast: its casts would be bypassed by the out= forms)
        return ForwardMode.AUTOGRAD
    return ForwardMode.INFERENCE
