"""The lean training Function (block_function.py) against autograd through
each operation of block_pass (a gate whose ``lean_backward`` flag is False),
and what it keeps.

The plain path is itself tested against the per-window reference
(test_gradients.py); here the Function must give the same outputs and
gradients (1e-4 relative, the issue's bound) in every configuration that
reaches it: each PoSGU gate, window classes of several shapes, shifted
windows, stochastic depth, gradient checkpointing, frozen parameters and
autocast; and it must keep only x, the pre-activation and the mixed
values.
"""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from posmlp_dense import PosMLP
from benchmarks.steps import SavedActivations
from posmlp_dense.block_function import LeanBlock
from posmlp_dense.gates import PoSGU

from conftest import randomize_

# Two levels; a 45 x 77 image gives 12 x 20 and 6 x 10 maps, which the
# windows tile along neither axis (four window classes per level).
ARCH = dict(embed_dims=(16, 32), depths=(2, 2), mlp_ratio=(4, 4),
            gamma=(4, 8), window_size=((5, 6), (4, 4)))
IMAGE = (45, 77)
GATES = [('gqpe', {}), ('gqpe', dict(gqpe_generalized=False)),
         ('lrpe', {}), ('lrpe', dict(pos_only=False))]
GATE_IDS = ['gqpe', 'gqpe_isotropic', 'lrpe', 'lrpe_token_matrix']

# Biases of the stem's convs, each followed by a train-mode BatchNorm, which
# subtracts the batch mean: their exact gradient is zero, and the computed
# one is rounding residue of either path.
ZERO_GRADIENT = {f'patch_embed.projs.{i}.bias' for i in range(3)}

pytestmark = pytest.mark.usefixtures('one_thread')


def _model(gate='gqpe', seed=0, **kwargs):
    kwargs.setdefault('drop_path_rate', 0.0)
    model = PosMLP(ARCH, gate=gate, out_indices=(0, 1), **kwargs)
    return randomize_(model, seed=seed).train()


def _run(model, x, lean, seed=1, autocast=None):
    """Outputs, input gradient and parameter gradients of one step with
    fixed random draws (stochastic depth)."""
    original = PoSGU.lean_backward
    PoSGU.lean_backward = lean
    try:
        model.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        torch.manual_seed(seed)
        if autocast is None:
            outs = model(x)
        else:
            with torch.autocast('cpu', dtype=autocast):
                outs = model(x)
        weights = torch.Generator().manual_seed(7)
        loss = sum((o.float() * torch.randn(o.shape, generator=weights)).sum()
                   for o in outs)
        loss.backward()
    finally:
        PoSGU.lean_backward = original
    grads = {name: p.grad for name, p in model.named_parameters()}
    return [o.detach() for o in outs], x.grad, grads


def _assert_same_step(model, x, rtol=1e-4, **kwargs):
    lean = _run(model, x, lean=True, **kwargs)
    plain = _run(model, x, lean=False, **kwargs)
    for a, b in zip(lean[0], plain[0]):
        torch.testing.assert_close(a, b, rtol=rtol, atol=1e-6)
    _assert_relative(lean[1], plain[1], rtol, 'input')
    assert lean[2].keys() == plain[2].keys()
    for name in plain[2]:
        if name in ZERO_GRADIENT:
            continue
        if plain[2][name] is None:
            assert lean[2][name] is None, name
        else:
            _assert_relative(lean[2][name], plain[2][name], rtol, name)
    return lean


def _assert_relative(a, b, rtol, name):
    """|a - b| <= rtol * max|b| (elementwise relative error is meaningless
    where a gradient is near zero)."""
    assert a is not None, name
    scale = b.abs().max().clamp_min(1e-12)
    err = ((a - b).abs().max() / scale).item()
    assert err <= rtol, f'{name}: relative difference {err:.2e} > {rtol}'


def _lean_calls(monkeypatch):
    calls = []
    forward = LeanBlock.forward

    def counting(ctx, *args):
        calls.append(1)
        return forward(ctx, *args)
    monkeypatch.setattr(LeanBlock, 'forward', staticmethod(counting))
    return calls


@pytest.mark.parametrize('gate,kwargs', GATES, ids=GATE_IDS)
def test_lean_step_equals_autograd_through_each_operation(gate, kwargs,
                                                          monkeypatch):
    calls = _lean_calls(monkeypatch)
    model = _model(gate, **kwargs)
    _assert_same_step(model, torch.randn(2, 3, *IMAGE))
    assert len(calls) == 4  # every block ran the Function


@pytest.mark.parametrize('options', [
    dict(shift=True), dict(drop_path_rate=0.5), dict(with_cp=True),
    dict(shift=True, drop_path_rate=0.5, with_cp=True)],
    ids=['shift', 'drop_path', 'with_cp', 'all'])
def test_lean_step_with_options(options):
    model = _model('gqpe', **options)
    lean = _assert_same_step(model, torch.randn(3, 3, *IMAGE))
    if options.get('drop_path_rate'):
        # the draws differ between samples: some sample's block was dropped
        again = _run(model, torch.randn(3, 3, *IMAGE), lean=True, seed=2)
        assert not torch.equal(again[0][0], lean[0][0])


@pytest.mark.parametrize('options', [
    dict(drop_path_rate=0.5), dict(shift=True, drop_path_rate=0.5)],
    ids=['drop_path', 'shift_drop_path'])
def test_lean_step_of_a_captured_graph_equals_eager(options):
    """The Function's backward as a captured graph runs it (the window
    layout by gathers, GELU's backward per half, stochastic depth's scale
    applied to what d_out meets) gives eager mode's gradients, with the
    same draws: run here in graph mode without a compiler."""
    from posmlp_dense.forward_mode import ForwardMode
    model = _model('gqpe', **options)
    x = torch.randn(3, 3, *IMAGE)
    eager = _run(model, x, lean=True)
    model.forward_mode = lambda _: ForwardMode(autograd=True, graph=True)
    try:
        graph = _run(model, x, lean=True)
    finally:
        del model.forward_mode
    for a, b in zip(graph[0], eager[0]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    _assert_relative(graph[1], eager[1], 1e-4, 'input')
    for name, g in eager[2].items():
        if name not in ZERO_GRADIENT:
            _assert_relative(graph[2][name], g, 1e-4, name)


def test_frozen_parameters_get_no_gradient():
    model = _model('gqpe')
    block = model.levels[1].encoder[0]
    for p in list(block.gate_unit.parameters()) + list(
            block.norm.parameters()) + [block.proj_c_e.weight]:
        p.requires_grad_(False)
    _, _, grads = _assert_same_step(model, torch.randn(1, 3, *IMAGE))
    assert grads['levels.1.encoder.0.gate_unit.pos.attention_centers'] is None
    assert grads['levels.1.encoder.0.norm.weight'] is None
    assert grads['levels.1.encoder.0.proj_c_e.weight'] is None
    assert grads['levels.1.encoder.0.proj_c_e.bias'] is not None


def test_lean_step_under_bf16_autocast():
    """Autocast: the same dtypes as autograd through each operation, so the
    same values up to bf16 rounding, and float32 gradients."""
    model = _model('gqpe')
    x = torch.randn(1, 3, *IMAGE)
    lean = _run(model, x, lean=True, autocast=torch.bfloat16)
    plain = _run(model, x, lean=False, autocast=torch.bfloat16)
    for a, b in zip(lean[0], plain[0]):
        assert a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    for name, g in lean[2].items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), name
        if name not in ZERO_GRADIENT:
            _assert_relative(g, plain[2][name], 5e-2, name)


def test_gradcheck_of_the_function():
    """Float64 finite differences through a level of two blocks (the second
    with shifted windows) whose windows tile neither axis, with stochastic
    depth: the input and every parameter of the level."""
    arch = dict(embed_dims=(4,), depths=(2,), mlp_ratio=(4,), gamma=(2,),
                window_size=((3, 4),))
    model = randomize_(PosMLP(arch, gate='gqpe', out_indices=(0,),
                              drop_path_rate=0.5, shift=True), seed=4)
    level = model.levels[0].double().train()
    named = list(level.named_parameters())
    names = [n for n, _ in named]
    params = tuple(p.detach().clone().requires_grad_() for _, p in named)
    x = torch.randn(3, 5, 7, 4, dtype=torch.float64, requires_grad=True)

    def forward(x, *values):
        torch.manual_seed(3)  # the same blocks dropped at every call
        return functional_call(level, dict(zip(names, values)), (x,))
    assert torch.autograd.gradcheck(forward, (x, *params), fast_mode=True)
    gate_names = [n for n in names if '.gate_unit.' in n]

    def gate_only(*gate_values):
        values = dict(zip(names, (p.detach() for p in params)))
        values.update(zip(gate_names, gate_values))
        return forward(x.detach(), *(values[n] for n in names))
    assert torch.autograd.gradcheck(
        gate_only, tuple(params[names.index(n)] for n in gate_names))


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_saved_activations_per_block(gate):
    """The lean Function keeps C + 3K values per token of a block (x, h, the
    mixed values); autograd through each operation keeps more than twice
    that. What does not grow with the batch (the gates' weights and their
    small graphs) is measured apart: the per-token part is the difference
    between two samples and one."""
    arch = dict(embed_dims=(16,), depths=(1,), mlp_ratio=(4,), gamma=(4,),
                window_size=((4, 4),))
    counts = {}
    for lean in (True, False):
        model = randomize_(PosMLP(arch, gate=gate, out_indices=(0,),
                                  drop_path_rate=0.0)).train()
        level = model.levels[0]
        params = list(level.parameters()) + list(level.buffers())
        totals = []
        for batch in (1, 2):
            x = torch.randn(batch, 16, 16, 16)  # a (B, H, W, C) level input
            original = PoSGU.lean_backward
            PoSGU.lean_backward = lean
            try:
                with SavedActivations(exclude=params) as saved:
                    level(x.requires_grad_())
            finally:
                PoSGU.lean_backward = original
            totals.append(saved.activation_bytes)
        counts[lean] = totals
    C, K, T = 16, 32, 16 * 16
    per_sample = counts[True][1] - counts[True][0]
    assert per_sample == 4 * T * (C + 2 * K + K)
    n, groups = 16, 4
    # per block: the weights and, for GQPE, the softmax's and key scale's
    # small graphs (a few (groups, N, N) and (groups, tokens) tensors)
    assert counts[True][0] - per_sample <= 6 * 4 * groups * max(n * n, T)
    plain_per_sample = counts[False][1] - counts[False][0]
    assert plain_per_sample > 2 * per_sample


def test_backward_leaves_saved_tensors_intact():
    """The backward writes over its own scratch buffers only: a second
    backward through the same graph (retain_graph) gives the same
    gradients."""
    model = _model('gqpe', drop_path_rate=0.3)
    x = torch.randn(2, 3, *IMAGE)
    torch.manual_seed(0)
    loss = sum((o ** 2).sum() for o in model(x))
    loss.backward(retain_graph=True)
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    loss.backward()
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, first[name]), name


def test_double_backward_is_refused():
    model = _model('gqpe')
    x = torch.randn(1, 3, *IMAGE, requires_grad=True)
    loss = sum((o ** 2).sum() for o in model(x))
    (grad,) = torch.autograd.grad(loss, x, create_graph=True)
    with pytest.raises(RuntimeError, match='differentiate twice'):
        grad.sum().backward()
