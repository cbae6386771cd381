"""The convolutions of the stem and the downsamplings, as a training step
records them: opaque operators, so that a compiled step serves every size.

``conv2d`` computes ``F.conv2d``. Where autograd records it (grad mode on
and a gradient wanted), it runs as the operator ``posmlp_dense::conv2d``,
whose backward is ``posmlp_dense::conv2d_input_grad`` and
``posmlp_dense::conv2d_weight_grad``: aten's ``convolution_backward``, the
kernel autograd itself runs. Elsewhere (inference, ``torch.export``, ONNX)
it is ``F.conv2d`` itself.

Why: torch's inductor compiles a graph that holds ``aten.convolution`` and
its backward for one map size only (torch 2.14.1), so a compiled training
step compiled again at every new input size:

* on a CPU, ``GraphLowering.decide_layout_opt`` turns layout optimization
  on for any graph with a convolution, and the backward then receives
  tensors laid out with integer strides of the first size, which its
  elementwise ops guard on;
* everywhere, ``convolution_backward_lowering`` (``_inductor/kernel/
  conv.py``) fixes the input gradient's strides as integers
  (``guard_int_seq``).

Inductor runs an opaque operator as it is, with the sizes and strides its
fake implementation gives (the output size formula, in the input's
layout), and never lowers a convolution of a training step. Inference
keeps ``aten.convolution``, which inductor compiles once for all sizes.

``nhwc=True`` takes and gives (B, H, W, C) maps, the levels' layout: the
operators permute inside, so the tensor saved for the backward is the map
itself, not a permuted view of it. (Inductor on a CPU lays out 4-D tensors
near a convolution channels-last, and cannot order the strides of such a
view under symbolic sizes: pytorch issues 185510 and 172204.)
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils import flop_counter


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: int,
           padding: int, groups: int = 1, nhwc: bool = False) -> Tensor:
    """``F.conv2d(x, weight, bias, stride, padding, groups=groups)``
    (dilation 1); through ``posmlp_dense::conv2d`` where a training step
    records it. ``nhwc``: ``x`` and the result are (B, H, W, C)."""
    if not _records_training_step(x, weight):
        if nhwc:
            return F.conv2d(x.permute(0, 3, 1, 2), weight, bias, stride,
                            padding, groups=groups).permute(0, 2, 3, 1)
        return F.conv2d(x, weight, bias, stride, padding, groups=groups)
    device = x.device.type
    if torch.is_autocast_enabled(device):
        # autocast does not see inside an operator: cast as it casts a
        # convolution (to its lower precision)
        dtype = torch.get_autocast_dtype(device)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    return _conv2d(x, weight, bias, stride, padding, groups, nhwc)


def _records_training_step(x, weight) -> bool:
    """Autograd records this convolution for a backward (eagerly or under
    torch.compile). Exporters (torch.export, and so ONNX; FX tracing)
    get aten's convolution, which they know."""
    if not (isinstance(x, Tensor) and isinstance(weight, Tensor)):
        return False  # FX tracing
    if torch.compiler.is_exporting():
        return False
    return torch.is_grad_enabled() and (x.requires_grad
                                        or weight.requires_grad)


def _nchw(x: Tensor, nhwc: bool) -> Tensor:
    """An (B, H, W, C) map as the (B, C, H, W) view convolutions take."""
    return x.permute(0, 3, 1, 2) if nhwc else x


def _as_given(y: Tensor, nhwc: bool) -> Tensor:
    """A (B, C, H, W) result in the layout the caller gave: (B, H, W, C),
    contiguous, where ``nhwc``."""
    return y.permute(0, 2, 3, 1).contiguous() if nhwc else y


@torch.library.custom_op('posmlp_dense::conv2d', mutates_args=())
def _conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: int,
            padding: int, groups: int, nhwc: bool) -> Tensor:
    x = _nchw(x, nhwc)
    y = F.conv2d(x, weight, bias, stride, padding, groups=groups)
    return _as_given(y.contiguous(memory_format=_output_format(x)), nhwc)


@_conv2d.register_fake
def _conv2d_fake(x, weight, bias, stride, padding, groups, nhwc):
    x = _nchw(x, nhwc)
    height, width = (
        (size + 2 * padding - kernel) // stride + 1
        for size, kernel in zip(x.shape[2:], weight.shape[2:]))
    y = torch.empty((x.shape[0], weight.shape[0], height, width),
                    dtype=x.dtype, device=x.device,
                    memory_format=_output_format(x))
    return _as_given(y, nhwc)


def _output_format(x: Tensor) -> torch.memory_format:
    """The output's layout: the input's. (aten's own choice also depends
    on a CPU backend's size threshold, C * H * W > 20480, on which tracing
    would guard; where aten chose another layout, _conv2d copies.)"""
    if x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def _convolution_backward(grad, x, weight, stride, padding, groups, nhwc,
                          which):
    """aten's convolution_backward asked for one gradient (0: the input's,
    in x's shape, 1: the weight's)."""
    mask = [which == 0, which == 1, False]
    result = torch.ops.aten.convolution_backward(
        _nchw(grad, nhwc), _nchw(x, nhwc), weight, None, [stride] * 2,
        [padding] * 2, [1, 1], False, [0, 0], groups, mask)[which]
    return result.permute(0, 2, 3, 1) if nhwc and which == 0 else result


@torch.library.custom_op('posmlp_dense::conv2d_input_grad', mutates_args=())
def _conv2d_input_grad(grad: Tensor, x: Tensor, weight: Tensor, stride: int,
                       padding: int, groups: int, nhwc: bool) -> Tensor:
    return _in_layout_of(_convolution_backward(
        grad, x, weight, stride, padding, groups, nhwc, 0), x)


@_conv2d_input_grad.register_fake
def _conv2d_input_grad_fake(grad, x, weight, stride, padding, groups, nhwc):
    return x.new_empty_strided(x.shape, x.stride())


@torch.library.custom_op('posmlp_dense::conv2d_weight_grad', mutates_args=())
def _conv2d_weight_grad(grad: Tensor, x: Tensor, weight: Tensor, stride: int,
                        padding: int, groups: int, nhwc: bool) -> Tensor:
    return _in_layout_of(_convolution_backward(
        grad, x, weight, stride, padding, groups, nhwc, 1), weight)


@_conv2d_weight_grad.register_fake
def _conv2d_weight_grad_fake(grad, x, weight, stride, padding, groups, nhwc):
    return weight.new_empty_strided(weight.shape, weight.stride())


def _in_layout_of(tensor: Tensor, like: Tensor) -> Tensor:
    """``tensor`` with the strides of ``like`` (what the fake
    implementations promise); a copy only where they differ."""
    if tensor.stride() == like.stride():
        return tensor
    return like.new_empty_strided(like.shape, like.stride()).copy_(tensor)


def _setup_context(ctx, inputs, output):
    x, weight, bias, stride, padding, groups, nhwc = inputs
    ctx.save_for_backward(x, weight)
    ctx.conf = (stride, padding, groups, nhwc)


def _backward(ctx, grad):
    x, weight = ctx.saved_tensors
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    grad_x = grad_w = grad_b = None
    if need_x:
        grad_x = _conv2d_input_grad(grad, x, weight, *ctx.conf)
    if need_w:
        grad_w = _conv2d_weight_grad(grad, x, weight, *ctx.conf)
    if need_b:
        grad_b = grad.sum((0, 1, 2) if ctx.conf[-1] else (0, 2, 3))
    return grad_x, grad_w, grad_b, None, None, None, None


_conv2d.register_autograd(_backward, setup_context=_setup_context)


def _refuse_double_backward(ctx, *grads):
    raise RuntimeError(
        'posmlp_dense::conv2d cannot differentiate twice: its gradient '
        'operators have no backward of their own (as the lean blocks, '
        'block_function.py, have none)')


_conv2d_input_grad.register_autograd(_refuse_double_backward)
_conv2d_weight_grad.register_autograd(_refuse_double_backward)


# torch's FlopCounterMode counts the operators as it counts aten's
# convolution and its backward
def _nchw_shape(shape, nhwc: bool):
    return [shape[0], shape[3], shape[1], shape[2]] if nhwc else shape


@flop_counter.register_flop_formula(torch.ops.posmlp_dense.conv2d)
def _conv2d_flops(x_shape, w_shape, bias_shape, stride, padding, groups,
                  nhwc, *, out_shape, **kwargs) -> int:
    return flop_counter.conv_flop_count(_nchw_shape(x_shape, nhwc), w_shape,
                                        _nchw_shape(out_shape, nhwc))


@flop_counter.register_flop_formula(torch.ops.posmlp_dense.conv2d_input_grad)
def _conv2d_input_grad_flops(grad_shape, x_shape, w_shape, stride, padding,
                             groups, nhwc, *, out_shape, **kwargs) -> int:
    return flop_counter.conv_flop_count(
        _nchw_shape(grad_shape, nhwc), w_shape, _nchw_shape(out_shape, nhwc),
        transposed=True)


@flop_counter.register_flop_formula(torch.ops.posmlp_dense.conv2d_weight_grad)
def _conv2d_weight_grad_flops(grad_shape, x_shape, w_shape, stride, padding,
                              groups, nhwc, *, out_shape, **kwargs) -> int:
    def swap(shape):  # the weight gradient: a convolution of x by grad
        return [shape[1], shape[0], *shape[2:]]
    return flop_counter.conv_flop_count(
        swap(_nchw_shape(x_shape, nhwc)), swap(_nchw_shape(grad_shape, nhwc)),
        swap(out_shape))
