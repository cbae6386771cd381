"""conv_function.conv2d: aten's convolution, with the same outputs,
gradients and layouts, recorded as an opaque operator only where a training
step records it."""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from posmlp_dense.conv_function import conv2d

# (in, out, kernel, stride, padding, groups): the stem's three convolutions
# and the depthwise downsampling with two outputs per channel
CONVS = ((3, 8, 3, 2, 1, 1), (8, 16, 3, 2, 1, 1), (16, 16, 1, 1, 0, 1),
         (16, 32, 3, 2, 1, 16))


def _output_and_gradients(fn, *inputs):
    """fn's output and the gradients of its inputs (cloned, which keeps
    their layout) for one fixed random output gradient."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1),
                     dtype=y.dtype)
    y.backward(dy)
    return (y, *(t.grad for t in leaves))


@pytest.mark.parametrize('conv', CONVS)
@pytest.mark.parametrize('size', [(9, 10), (12, 7), (1, 1)])
@pytest.mark.parametrize('channels_last', [False, True])
def test_outputs_gradients_and_layouts_are_atens(conv, size, channels_last):
    cin, cout, k, stride, padding, groups = conv
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, cin, *size, generator=gen, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(cout, cin // groups, k, k, generator=gen,
                    dtype=torch.float64)
    b = torch.randn(cout, generator=gen, dtype=torch.float64)
    results = [_output_and_gradients(
        lambda *leaves: fn(*leaves, stride, padding, groups=groups), x, w, b)
        for fn in (conv2d, F.conv2d)]
    for ours, ref, name in zip(*results, ('y', 'dx', 'dw', 'db')):
        torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12,
                                   msg=name)
        if ref.shape[2:].numel() > 1:  # size-1 dims have no defined stride
            assert ours.stride() == ref.stride(), name


def test_a_training_step_records_the_operator_and_inference_does_not():
    """The operator only where autograd records a backward: with grad off,
    with nothing to differentiate, or under torch.export, the graph holds
    aten's convolution."""
    x = torch.randn(1, 4, 8, 8)
    w = torch.randn(8, 1, 3, 3, requires_grad=True)

    def ops(fn, *args):
        gm = torch.fx.experimental.proxy_tensor.make_fx(fn)(*args)
        return {str(n.target) for n in gm.graph.nodes
                if n.op == 'call_function'}

    def step(x, w):
        return conv2d(x, w, None, 2, 1, 4)

    assert 'posmlp_dense.conv2d.default' in ops(step, x, w)
    with torch.no_grad():
        assert 'posmlp_dense.conv2d.default' not in ops(step, x, w)
    assert 'posmlp_dense.conv2d.default' not in ops(step, x, w.detach())

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(w.detach().clone())

        def forward(self, x):
            return conv2d(x, self.w, None, 2, 1, 4)

    exported = torch.export.export(Conv(), (x,))
    targets = {str(n.target) for n in exported.graph.nodes}
    assert 'aten.conv2d.default' in targets, targets


def test_autocast_runs_it_in_the_autocast_dtype():
    """Autocast cannot see inside an operator; the wrapper casts as
    autocast casts a convolution, and each gradient comes back in its
    input's dtype."""
    x = torch.randn(1, 4, 9, 9, requires_grad=True)
    w = torch.randn(8, 1, 3, 3, requires_grad=True)
    b = torch.randn(8, requires_grad=True)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        y = conv2d(x, w, b, 2, 1, 4)
        ref = F.conv2d(x, w, b, 2, 1, groups=4)
    assert y.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref)
    y.float().sum().backward()
    assert (x.grad.dtype, w.grad.dtype, b.grad.dtype) == (torch.float32,) * 3


@pytest.mark.parametrize('conv', CONVS)
@pytest.mark.parametrize('size', [(9, 10), (1, 1)])
def test_nhwc_takes_and_gives_channels_last_maps(conv, size):
    """nhwc=True: a (B, H, W, C) map in, a contiguous (B, H, W, C) map out,
    and the gradient of the map in its layout: aten's convolution of the
    NCHW view, permuted back."""
    cin, cout, k, stride, padding, groups = conv
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, *size, cin, generator=gen, dtype=torch.float64)
    w = torch.randn(cout, cin // groups, k, k, generator=gen,
                    dtype=torch.float64)
    b = torch.randn(cout, generator=gen, dtype=torch.float64)

    def reference(x, w, b):
        return F.conv2d(x.permute(0, 3, 1, 2), w, b, stride, padding,
                        groups=groups).permute(0, 2, 3, 1)

    def ours(x, w, b):
        return conv2d(x, w, b, stride, padding, groups, nhwc=True)

    results = [_output_and_gradients(fn, x, w, b)
               for fn in (ours, reference)]
    for mine, ref, name in zip(*results, ('y', 'dx', 'dw', 'db')):
        torch.testing.assert_close(mine, ref, rtol=1e-12, atol=1e-12,
                                   msg=name)
    y, dx = results[0][:2]
    assert y.is_contiguous() and dx.is_contiguous()
    with torch.no_grad():       # aten's convolution, a permuted view
        torch.testing.assert_close(ours(x, w, b), reference(x, w, b))


@pytest.mark.parametrize('conv', CONVS)
def test_flop_counter_counts_it_as_atens(conv):
    """torch's FlopCounterMode (the benchmark's and the published-model
    test's FLOPs) counts the operator and its backward as aten's
    convolution and convolution_backward."""
    from torch.utils.flop_counter import FlopCounterMode
    cin, cout, k, stride, padding, groups = conv
    totals = []
    nhwc = functools.partial(conv2d, nhwc=True)
    for fn in (conv2d, F.conv2d, nhwc):
        x = torch.randn(2, cin, 13, 10, requires_grad=True)
        w = torch.randn(cout, cin // groups, k, k, requires_grad=True)
        if fn is nhwc:
            x = x.detach().permute(0, 2, 3, 1).contiguous().requires_grad_()
        with FlopCounterMode(display=False) as counter:
            fn(x, w, None, stride, padding, groups=groups).sum().backward()
        totals.append(counter.get_total_flops())
    assert totals[0] == totals[1] == totals[2] > 0
