"""Gradients against independently computed ones.

* Autograd through the model against autograd through the per-window
  reference (tests/reference.py: every window's real tokens alone, mixing
  weights from the published formulas): the input gradient and every
  parameter's gradient, for each gate, at map sizes the windows do not tile.
* ``torch.autograd.gradcheck`` in float64 on a tiny level: the model's
  analytical gradients against finite differences of its own forward.
"""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from posmlp_dense import PosMLP

from conftest import randomize_
from reference import per_window_forward_levels

# One level of one block: a 45 x 37 image gives a 12 x 10 map, which
# (5, 4) windows do not tile along either axis.
BLOCK_ARCH = dict(embed_dims=(16,), depths=(1,), mlp_ratio=(4,), gamma=(4,),
                  window_size=((5, 4),))
# A level with its downsampling and two blocks (shifted windows in the
# second): the 12 x 10 map becomes 6 x 5, cut into 4 x 4 windows.
LEVEL_ARCH = dict(embed_dims=(8, 16), depths=(0, 2), mlp_ratio=(4, 4),
                  gamma=(2, 4), window_size=((5, 4), (4, 4)))
IMAGE = (45, 37)
GATES = [('gqpe', {}), ('gqpe', dict(gqpe_generalized=False)),
         ('lrpe', {}), ('lrpe', dict(pos_only=False)), ('sgu', {})]
GATE_IDS = ['gqpe', 'gqpe_isotropic', 'lrpe', 'lrpe_token_matrix', 'sgu']


pytestmark = pytest.mark.usefixtures('one_thread')


def _model(arch, gate, seed=0, **kwargs):
    levels = tuple(range(len(arch['depths'])))
    model = PosMLP(arch, gate=gate, out_indices=levels, out_norm=False,
                   drop_path_rate=0.0, **kwargs)
    return randomize_(model, seed=seed)


def _gradients(model, x, forward, cotangents):
    """d(sum of cotangent * output)/d(input, every parameter)."""
    model.zero_grad(set_to_none=True)
    x = x.clone().requires_grad_()
    maps = forward(model, x)
    loss = sum((m * c).sum() for m, c in zip(maps, cotangents))
    loss.backward()
    grads = {'input': x.grad}
    grads.update({name: p.grad for name, p in model.named_parameters()})
    return grads


def ours(model, x):
    """The model's level outputs as (B, H, W, C) maps."""
    return [y.permute(0, 2, 3, 1) for y in model(x)]


def _assert_same_gradients(model, x, tol=2e-5):
    with torch.no_grad():
        shapes = [m.shape for m in ours(model, x)]
    gen = torch.Generator().manual_seed(7)
    cotangents = [torch.randn(s, generator=gen) for s in shapes]
    got = _gradients(model, x, ours, cotangents)
    want = _gradients(model, x, per_window_forward_levels, cotangents)
    assert got.keys() == want.keys()
    for name, g in got.items():
        w = want[name]
        assert g is not None and w is not None, name
        scale = w.abs().max().item()
        err = (g - w).abs().max().item()
        assert err <= tol * max(1.0, scale), \
            f'{name}: max error {err:.3g} (largest gradient {scale:.3g})'
        assert scale > 0, f'{name}: the reference gradient is zero'


@pytest.mark.parametrize('gate,kwargs', GATES, ids=GATE_IDS)
@pytest.mark.parametrize('training', [True, False], ids=['train', 'eval'])
def test_block_gradients_equal_the_reference(gate, kwargs, training):
    # norm_eval: the stem's BatchNorms use their statistics, so the gradients
    # of the stem's conv biases are not the rounding noise of an exact zero
    model = _model(BLOCK_ARCH, gate, norm_eval=True, **kwargs)
    model.train(training)
    _assert_same_gradients(model, torch.randn(2, 3, *IMAGE))


@pytest.mark.parametrize('gate,kwargs', GATES[:1] + GATES[2:3] + GATES[4:],
                         ids=['gqpe', 'lrpe', 'sgu'])
def test_level_gradients_equal_the_reference(gate, kwargs):
    model = _model(LEVEL_ARCH, gate, shift=True, **kwargs).eval()
    _assert_same_gradients(model, torch.randn(1, 3, *IMAGE))


# ------------------------------------------------------------- gradcheck
# A level with downsampling and one block: a 21 x 17 image, a 6 x 5 stem
# map, a 3 x 3 level map in 2 x 2 windows (partial ones included).
TINY_ARCH = dict(embed_dims=(2, 4), depths=(0, 1), mlp_ratio=(2, 2),
                 gamma=(1, 2), window_size=((2, 2), (2, 2)))


def _level_function(model, names):
    """f(image, *level parameters) -> the level's output (float64)."""
    def forward(x, *params):
        state = dict(zip(names, params))
        return functional_call(model, state, (x,))[-1]
    return forward


@pytest.mark.parametrize('gate,kwargs', GATES, ids=GATE_IDS)
def test_gradcheck_of_a_tiny_level(gate, kwargs):
    model = _model(TINY_ARCH, gate, seed=3, **kwargs).double().eval()
    named = [(n, p) for n, p in model.named_parameters()
             if n.startswith('levels.1.')]
    names = [n for n, _ in named]
    params = tuple(p.detach().clone().requires_grad_() for _, p in named)
    x = torch.randn(1, 3, 21, 17, dtype=torch.float64, requires_grad=True)
    forward = _level_function(model, names)
    # every input and parameter, along random directions ...
    assert torch.autograd.gradcheck(forward, (x, *params), fast_mode=True)
    # ... and the gate's own parameters entry by entry
    gate_names = [n for n in names if '.gate_unit.' in n]
    assert gate_names
    frozen = [p.detach() for p in params]

    def gate_only(*gate_params):
        mixed = dict(zip(names, frozen))
        mixed.update(zip(gate_names, gate_params))
        return forward(x.detach(), *(mixed[n] for n in names))
    assert torch.autograd.gradcheck(
        gate_only, tuple(params[names.index(n)] for n in gate_names))


@pytest.mark.parametrize('shape, window, origin', [
    ((2, 9, 11), (4, 4), (0, 0)),   # partial windows
    ((1, 10, 10), (4, 4), (2, 2)),  # shifted grid
])
def test_window_layout_gradients(shape, window, origin):
    """to_windows and to_map are plain autograd operations: their gradients,
    first and second order, pass gradcheck, and to_map inverts to_windows."""
    from posmlp_dense.windows import window_grid
    B, H, W = shape
    grid = window_grid(H, W, window, origin)
    x = torch.randn(6, B, H, W, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(3, 2 * B * grid.rows * grid.cols,
                         window[0] * window[1], dtype=torch.float64)

    def through(t):
        rows = grid.to_windows(t, 3)
        return grid.to_map(rows * rows * weight)
    assert torch.autograd.gradcheck(through, (x,))
    assert torch.autograd.gradgradcheck(through, (x,))
