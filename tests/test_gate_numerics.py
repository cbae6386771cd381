"""Options off the published path, against the reference: the isotropic GQPE
(``gqpe_generalized=False``) and the absolute position embedding
(``ape=True``).

The reference (tests/reference.py) computes their formulas itself: the
isotropic score sigma^2 (d1 dx + d2 dy) - (dx^2 + dy^2) / 2 and the stored
embedding reshaped and resized bicubically.
"""
from __future__ import annotations

import pytest
import torch

from posmlp_dense import PosMLP
from posmlp_dense.gates.gqpe import GQPE
from posmlp_dense.workspace import Workspace

from conftest import TINY_ARCH, randomize_
from reference import gqpe_scores, per_window_forward_levels


pytestmark = pytest.mark.usefixtures('one_thread')


def level_maps(model, x):
    """The model's raw level outputs as (B, H, W, C) maps."""
    with torch.no_grad():
        return [y.permute(0, 2, 3, 1) for y in model(x)]


def _assert_equal_to_reference(model, size, tol=1e-5):
    x = torch.randn(1, 3, *size)
    ours = level_maps(model, x)
    with torch.no_grad():
        ref = per_window_forward_levels(model, x)
    assert len(ours) == len(ref)
    for level, (a, b) in enumerate(zip(ours, ref)):
        assert a.shape == b.shape, level
        err = (a - b).abs().max().item()
        assert err <= tol, f'level {level} at {size}: max error {err:.3g}'
    return ours


# ---------------------------------------------------------- isotropic GQPE
def _isotropic(**kwargs):
    model = PosMLP(TINY_ARCH, gate='gqpe', gqpe_generalized=False,
                   out_norm=False, **kwargs)
    return randomize_(model).eval()


@pytest.mark.parametrize('size', [(224, 224), (97, 161)],
                         ids=['tiled', 'partial'])
def test_isotropic_gqpe_equals_the_reference(size):
    _assert_equal_to_reference(_isotropic(), size)


def test_isotropic_gqpe_shifted_windows_equal_the_reference():
    arch = dict(TINY_ARCH, depths=(2, 2, 2, 2), window_size=(7, 7, 7, 7))
    model = randomize_(PosMLP(arch, gate='gqpe', gqpe_generalized=False,
                              shift=True, out_norm=False)).eval()
    _assert_equal_to_reference(model, (97, 161))


def test_isotropic_scores_by_hand():
    """The reference's isotropic score on a 2 x 2 window, written out for
    one query: a wrong sign in it would make every comparison above moot."""
    model = _isotropic()
    pos = model.levels[0].encoder[0].gate_unit.pos
    with torch.no_grad():
        pos.attention_centers.copy_(torch.tensor([[0.5, -2.0]] * pos.groups))
        pos.attention_spreads.fill_(1.5)
    ys, xs = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1])
    scores = gqpe_scores(pos, ys, xs)[0, 0]  # query (0, 0)
    # keys (0,0), (0,1), (1,0), (1,1): (dx, dy) = (0,0), (1,0), (0,-1), (1,-1)
    s2 = 2.25
    want = torch.tensor([0.0, s2 * 0.5 - 0.5, s2 * 2.0 - 0.5,
                         s2 * (0.5 + 2.0) - 1.0], dtype=torch.float64)
    assert torch.allclose(scores.detach(), want)


# ------------------------------------------- absolute position embedding
def _with_ape(gate, grid):
    model = PosMLP(TINY_ARCH, gate=gate, ape=True, ape_grid=grid,
                   out_norm=False)
    randomize_(model)
    with torch.no_grad():  # large enough to matter next to the stem's map
        model.absolute_pos_embed.normal_()
    return model.eval()


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
@pytest.mark.parametrize('size', [(112, 96), (97, 161)],
                         ids=['grid_size', 'resized'])
def test_absolute_position_embedding_equals_the_reference(gate, size):
    # a 112 x 96 image gives a 28 x 24 stem map: the embedding's own grid
    model = _with_ape(gate, (28, 24))
    ours = _assert_equal_to_reference(model, size)
    with torch.no_grad():
        model.absolute_pos_embed.zero_()
    torch.manual_seed(0)
    without = _assert_equal_to_reference(model, size)
    # the embedding changed the result (the comparison was not vacuous)
    assert not torch.allclose(ours[0], without[0], atol=1e-3)


# ------------------------------------------------- large activations
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe', 'sgu'])
def test_blocks_with_large_activations_equal_the_reference(gate):
    """With the small random weights of ``randomize_`` the blocks' GELU sees
    inputs of about +-0.1, where it is nearly linear: an approximate GELU
    would pass every comparison. Here its inputs span several units."""
    model = randomize_(PosMLP(TINY_ARCH, gate=gate, out_norm=False)).eval()
    seen = []
    for level in model.levels:
        for block in level.encoder:
            with torch.no_grad():
                block.proj_c_e.weight.mul_(20.0)
            # the reference calls proj_c_e as a module: note what GELU gets
            block.proj_c_e.register_forward_hook(
                lambda mod, args, out: seen.append(out.detach().abs().max()))
    x = torch.randn(1, 3, 97, 161)
    ours = level_maps(model, x)
    with torch.no_grad():
        ref = per_window_forward_levels(model, x)
    assert min(seen) > 3.0, 'the GELU inputs are not large'
    for level, (a, b) in enumerate(zip(ours, ref)):
        scale = b.abs().max().item()
        err = (a - b).abs().max().item()
        assert err <= 1e-5 * max(1.0, scale), \
            f'level {level}: max error {err:.3g} (largest value {scale:.3g})'


# ------------------------------------------------ matrices without autograd
@pytest.mark.parametrize('gate,kwargs', [
    ('gqpe', {}), ('gqpe', dict(gqpe_generalized=False)), ('lrpe', {}),
    ('lrpe', dict(pos_only=False))],
    ids=['gqpe', 'gqpe_isotropic', 'lrpe', 'lrpe_token_matrix'])
def test_matrices_without_grad_equal_the_autograd_ones(gate, kwargs):
    """Without autograd (eval mode's cache, the lean training Function) a
    gate writes its augmented matrices in place, GQPE with its scores and
    softmax in a workspace's buffers. They must be the autograd path's bit
    for bit, for full and partial windows, with or without a workspace, and
    a buffer reused for a smaller window must not leak into it."""
    model = randomize_(PosMLP(TINY_ARCH, gate=gate, **kwargs)).train()
    unit = model.levels[0].encoder[0].gate_unit
    wh, ww = unit.window
    workspace = Workspace()
    for key in [(0, wh, 0, ww), (0, wh, 0, ww - 2), (1, wh, 0, 2),
                (0, 1, 0, 1), (0, wh, 0, ww)]:
        reference = unit.augmented_mixing(key)
        assert reference.requires_grad  # the autograd path
        with torch.no_grad():
            alone = unit.augmented_mixing(key, fresh=True)
            shared = unit.augmented_mixing(key, fresh=True,
                                           workspace=workspace)
        assert torch.equal(alone, reference.detach()), key
        assert torch.equal(shared, reference.detach()), key


# -------------------------------------- GQPE's parameters, without autograd
@pytest.mark.parametrize('generalized,symmetric', [
    (True, True), (True, False), (False, True)],
    ids=['generalized', 'generalized_asymmetric', 'isotropic'])
def test_parameter_gradients_equal_autograd(generalized, symmetric):
    """The lean backward gets the centres' and spreads' gradients from the
    score coefficients' in closed form. They must be what autograd through
    ``score_coefficients`` gives, for every form of the spread (the
    asymmetric one is reachable only by building GQPE directly)."""
    torch.manual_seed(0)
    pos = GQPE((5, 4), groups=3, generalized=generalized,
               symmetric=symmetric)
    with torch.no_grad():
        for p in (pos.attention_centers, pos.attention_spreads):
            p.copy_(torch.randn_like(p))
    d_coefficients = torch.randn_like(pos.score_coefficients())
    params = [pos.attention_centers, pos.attention_spreads]
    expected = torch.autograd.grad(
        (pos.score_coefficients() * d_coefficients).sum(), params)
    with torch.no_grad():
        got = pos.parameter_gradients(d_coefficients)
    for name, want in zip(['attention_centers', 'attention_spreads'],
                          expected):
        assert got[name].shape == want.shape, name
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-6,
                                   msg=name)


def test_shared_coefficients_last_one_call():
    """Inside ``sharing_parameter_terms`` the matrices of a block's window
    classes reuse one computation of the score coefficients: equal to a
    fresh one, never used where autograd records a graph, and forgotten on
    exit, so that a parameter update before the next call is seen."""
    torch.manual_seed(0)
    pos = GQPE((4, 4), groups=2)
    with pos.sharing_parameter_terms():
        with torch.no_grad():
            first = pos.score_coefficients()
            assert pos.score_coefficients() is first
        assert torch.equal(first, pos._coefficients().detach())
        assert pos.score_coefficients().requires_grad
    with torch.no_grad():
        pos.attention_centers.add_(1.0)
        with pos.sharing_parameter_terms():
            updated = pos.score_coefficients()
    assert not torch.equal(updated, first)
    assert torch.equal(updated, pos._coefficients())
