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
    for level in model.levels:
        for block in level.encoder:
            with torch.no_grad():
                block.proj_c_e.weight.mul_(20.0)
    x = torch.randn(1, 3, 97, 161)
    ours = level_maps(model, x)     # the fused pass: no hook yet
    # the reference calls proj_c_e as a module: note what GELU gets (a
    # hook would send the model itself through its module calls)
    seen = []
    for level in model.levels:
        for block in level.encoder:
            block.proj_c_e.register_forward_hook(
                lambda mod, args, out: seen.append(out.detach().abs().max()))
    with torch.no_grad():
        ref = per_window_forward_levels(model, x)
    assert min(seen) > 3.0, 'the GELU inputs are not large'
    for level, (a, b) in enumerate(zip(ours, ref)):
        scale = b.abs().max().item()
        err = (a - b).abs().max().item()
        assert err <= 1e-5 * max(1.0, scale), \
            f'level {level}: max error {err:.3g} (largest value {scale:.3g})'


# ------------------------------------------------ one formula, every mode
def _outputs_in_every_mode(model, x):
    """Level outputs in eval without autograd, eval with it, a training
    step (the lean Function) and a captured graph (each gate's own
    weights), and one gate's matrices for a partial window."""
    model.eval()
    with torch.no_grad():
        plain = model(x)
    graded = [y.detach() for y in model(x)]
    model.train()
    trained = [y.detach() for y in model(x)]
    model.eval()
    torch._dynamo.reset()
    with torch.no_grad():
        captured = torch.compile(model, backend='eager', fullgraph=True)(x)
    gate = model.levels[0].encoder[0].gate_unit
    with torch.no_grad():
        matrices = gate.mixing_matrices((0, 5, 2, 14))[0]
    return plain, graded, trained, captured, matrices


def test_gqpe_formula_lives_in_one_function(monkeypatch):
    """Patch gqpe.score_terms, and every mode (inference, eval with
    autograd, a training forward through the lean Function, a captured
    graph, the analysis matrices) changes together, and still agrees with
    itself."""
    import posmlp_dense.gates.gqpe as gqpe
    # norm_eval: no batch statistics in training, so all modes agree
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe', drop_path_rate=0.0,
                              norm_eval=True))
    with torch.no_grad():  # blocks whose gates matter to the outputs
        for level in model.levels:
            for block in level.encoder:
                block.proj_c_s.weight.mul_(20.0)
    x = torch.randn(1, 3, 97, 161)
    before = _outputs_in_every_mode(model, x)
    original = gqpe.score_terms

    def doubled(*args, **kwargs):
        return tuple(2 * term for term in original(*args, **kwargs))
    monkeypatch.setattr(gqpe, 'score_terms', doubled)
    after = _outputs_in_every_mode(model, x)
    for mode_before, mode_after in zip(before[:4], after[:4]):
        for level_before, level_after, reference in zip(
                mode_before, mode_after, after[0]):
            assert (level_before - level_after).abs().max() > 1e-4
            torch.testing.assert_close(level_after, reference, rtol=1e-5,
                                       atol=1e-5)
    assert not torch.allclose(before[4], after[4], atol=1e-4)


def test_gqpe_weights_in_a_captured_graph_equal_eager():
    """A captured graph scores every query/key pair term by term, eager
    scores the offsets by a matmul and gathers them: the weights agree to
    the rounding of the scores (float32, of magnitude up to
    -NEGLIGIBLE_SCORE: a few 1e-6, which the softmax's exp makes relative),
    stacked or each encoding's own, and the same keys are dropped as
    negligible."""
    from posmlp_dense.gates import GQPE
    torch.manual_seed(0)
    encodings = [GQPE((7, 5), 4), GQPE((7, 5), 4)]
    with torch.no_grad():
        for encoding in encodings:  # some scores below NEGLIGIBLE_SCORE
            encoding.attention_spreads.mul_(6.0)
            encoding.attention_centers.normal_(0.0, 2.0)
    eager = GQPE.stacked_weights(encodings)
    assert (eager == 0).any() and ((eager > 0).sum(-1) > 1).any()
    stacked = torch.compile(
        lambda: GQPE.stacked_weights(encodings, captured=True),
        backend='eager', fullgraph=True)()
    own = torch.cat([GQPE.stacked_weights([encoding], captured=True)
                     for encoding in encodings])
    for captured in (stacked, own):
        assert torch.equal(captured == 0, eager == 0)
        torch.testing.assert_close(captured, eager, rtol=1e-4, atol=1e-6)


def test_the_forward_tells_gqpe_whether_a_graph_is_captured(monkeypatch):
    """The forward decides its mode once (forward_mode.py) and hands GQPE
    the capture flag: the per-pair scores in a captured graph, the
    per-offset ones in eager, in every level."""
    from posmlp_dense.gates import gqpe
    seen = []
    original = gqpe.softmax_weights

    def spy(*args, **kwargs):
        seen.append(args[4])
        return original(*args, **kwargs)
    monkeypatch.setattr(gqpe, 'softmax_weights', spy)
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe')).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        model(x)
        assert seen == [False] * 4
        seen.clear()
        torch.compile(model, backend='eager', fullgraph=True)(x)
        # (without autograd, each gate computes its own weights)
        assert seen == [True] * sum(TINY_ARCH['depths'])
        seen.clear()
    torch.compile(model, backend='eager', fullgraph=True)(x)
    assert seen == [True] * 4


def test_partial_window_matrices_equal_the_published_softmax():
    """A partial window's matrices (the full window's softmax renormalized
    over the real keys, token_mixing.key_scale) are the published softmax
    over the real keys alone, also when the Gaussians sit far from the
    window's real part."""
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe'))
    gate = model.levels[0].encoder[0].gate_unit
    with torch.no_grad():
        gate.pos.attention_centers.copy_(torch.tensor(
            [[6.0, -6.0], [-5.0, 4.0], [0.5, 0.0], [3.0, 6.5]]))
    wh, ww = gate.window
    for rect in [(0, wh, 0, ww), (0, 2, 0, ww), (wh - 1, wh, 3, 9),
                 (0, 1, 0, 1), (5, wh, ww - 3, ww)]:
        with torch.no_grad():
            weights, bias = gate.mixing_matrices(rect)
        ys, xs = torch.meshgrid(torch.arange(rect[0], rect[1]),
                                torch.arange(rect[2], rect[3]),
                                indexing='ij')
        want = gqpe_scores(gate.pos, ys.reshape(-1), xs.reshape(-1)
                           ).softmax(-1).float()
        torch.testing.assert_close(weights, want, rtol=1e-5, atol=1e-6)
        index = (ys * ww + xs).reshape(-1)
        assert torch.equal(bias, gate.pos.token_proj_n_bias.view(-1)[index])
