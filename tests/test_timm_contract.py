"""timm's model interface, with the semantics of timm's Swin and ConvNeXt.

Semantics are checked on a reduced PosMLP (TINY_ARCH) at small inputs; what
goes through timm's registry and builder (create_model arguments,
features_only, pretrained_cfg, pretrained loading) on posmlp_t.
"""
from __future__ import annotations

import copy

import pytest
import timm
import timm.optim
import torch
from timm.models import get_model_input_config, group_parameters
from timm.models._features import FeatureGetterNet

from posmlp_dense import CheckpointError, PosMLPClassifier
from posmlp_dense.classifier import GLOBAL_POOLS

from conftest import TINY_ARCH, randomize_

DIMS = TINY_ARCH['embed_dims']


def _tiny(**kwargs) -> PosMLPClassifier:
    kwargs.setdefault('num_classes', 7)
    return randomize_(PosMLPClassifier(TINY_ARCH, **kwargs)).eval()


def _x(size=(64, 96), batch=2):
    return torch.randn(batch, 3, *size)


def _close(a, b, tol=1e-5):
    return a.shape == b.shape and (a - b).abs().max().item() <= tol


# ------------------------------------------------------------------ the head
@pytest.mark.parametrize('pool', GLOBAL_POOLS)
def test_pooling_widths_and_head_hidden_size(pool):
    model = _tiny(global_pool=pool)
    mult = 2 if pool == 'catavgmax' else 1
    assert model.num_features == DIMS[-1]
    assert model.head_hidden_size == DIMS[-1] * mult
    with torch.no_grad():
        feats = model.forward_features(_x())
        pre = model.forward_head(feats, pre_logits=True)
        logits = model(_x())
    assert feats.shape == (2, DIMS[-1], 2, 3)
    if pool:
        assert pre.shape == (2, model.head_hidden_size)
        assert logits.shape == (2, 7)
    else:  # no pooling: the map itself, classified at every position
        assert _close(pre, feats)
        assert logits.shape == (2, 7, 2, 3)


def test_forward_is_forward_head_of_forward_features():
    model = _tiny()
    x = _x()
    with torch.no_grad():
        feats = model.forward_features(x)
        assert _close(model(x), model.forward_head(feats))
        # published head: LayerNorm'd map, mean over positions, Linear
        pooled = feats.mean(dim=(2, 3))
        assert _close(model.forward_head(feats, pre_logits=True), pooled)
        assert _close(model(x), model.get_classifier()(pooled))


def test_reset_classifier_keeps_or_changes_the_pooling():
    model = _tiny(global_pool='max')
    x = _x()
    with torch.no_grad():
        pre = model.forward_head(model.forward_features(x), pre_logits=True)
        model.reset_classifier(0)  # pooling kept
        assert model.num_classes == 0
        assert model.global_pool.pool_type == 'max'
        assert _close(model(x), pre)
        model.reset_classifier(0, '')  # no pooling: the final map
        assert _close(model(x), model.forward_features(x))
        model.reset_classifier(3, 'catavgmax')
        assert model.head_hidden_size == 2 * DIMS[-1]
        assert model.get_classifier().in_features == 2 * DIMS[-1]
        assert model(x).shape == (2, 3)


def test_reset_classifier_builds_a_fresh_head_like_the_model():
    model = _tiny().double()
    old = model.get_classifier().weight.detach().clone()
    model.reset_classifier(7)
    head = model.get_classifier()
    assert head.weight.dtype == torch.float64
    assert not torch.equal(head.weight, old)
    assert head.weight.std().item() == pytest.approx(0.02, rel=0.3)
    assert torch.count_nonzero(head.bias) == 0


@pytest.mark.parametrize('bad', [dict(global_pool='mean'),
                                 dict(global_pool='token'),
                                 dict(num_classes=-1),
                                 dict(num_classes=2.0),
                                 dict(drop_rate=1.0)])
def test_bad_head_settings_raise(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        PosMLPClassifier(TINY_ARCH, **bad)


@pytest.mark.parametrize('option', ['out_indices', 'out_norm'])
def test_backbone_output_options_are_refused(option):
    with pytest.raises(TypeError, match='forward_intermediates'):
        PosMLPClassifier(TINY_ARCH, **{option: (0, 1)})


# -------------------------------------------------- forward_intermediates
def test_intermediates_are_the_raw_levels_and_final_is_forward_features():
    model = _tiny()
    x = _x()
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        assert _close(final, model.forward_features(x))
    assert [m.shape[1] for m in maps] == list(DIMS)
    assert [tuple(m.shape[2:]) for m in maps] == [(16, 24), (8, 12), (4, 6),
                                                  (2, 3)]
    # raw: the final norm is not applied to the last level's map
    assert not _close(maps[-1], final, tol=1e-3)


@pytest.mark.parametrize('indices,levels', [
    (None, [0, 1, 2, 3]), (1, [3]), (3, [1, 2, 3]), ([0, 2], [0, 2]),
    ([2, 0], [0, 2]), ([-1], [3]), ((-4, -3), [0, 1])])
def test_indices_select_levels_as_timm_does(indices, levels):
    model = _tiny()
    x = _x()
    with torch.no_grad():
        every = model.forward_intermediates(x, intermediates_only=True)
        maps = model.forward_intermediates(x, indices=indices,
                                           intermediates_only=True)
    assert len(maps) == len(levels)
    for got, level in zip(maps, levels):
        assert _close(got, every[level])


@pytest.mark.parametrize('indices', [5, 0, [4], [-5], (0, 7)])
def test_out_of_range_indices_raise(indices):
    model = _tiny()
    with pytest.raises(AssertionError, match='out of range'):
        model.forward_intermediates(_x(), indices=indices)


def test_norm_applies_the_final_norm_to_the_last_level_only():
    model = _tiny()
    x = _x()
    with torch.no_grad():
        raw = model.forward_intermediates(x, intermediates_only=True)
        normed = model.forward_intermediates(x, norm=True,
                                             intermediates_only=True)
        assert _close(normed[-1], model.forward_features(x))
    for a, b in zip(raw[:-1], normed[:-1]):
        assert _close(a, b, tol=0)


def _count_level_calls(model):
    calls = [0] * len(model.levels)
    for i, level in enumerate(model.levels):
        level.register_forward_hook(
            lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


def test_stop_early_runs_no_level_past_the_last_requested():
    model = _tiny()
    calls = _count_level_calls(model)
    x = _x()
    with torch.no_grad():
        final, maps = model.forward_intermediates(x, indices=[1],
                                                  stop_early=True)
        assert calls == [1, 1, 0, 0]
        # the final output is then the raw output of the last level run
        assert _close(final, maps[0], tol=0)
        model.forward_intermediates(x, indices=[1])
        assert calls == [2, 2, 1, 1]


def test_stop_early_at_the_last_level_still_gives_forward_features():
    model = _tiny()
    x = _x()
    with torch.no_grad():
        final, _ = model.forward_intermediates(x, indices=[0, 3],
                                               stop_early=True)
        assert _close(final, model.forward_features(x))


def test_output_fmt():
    model = _tiny()
    x = _x()
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        final_hwc, maps_hwc = model.forward_intermediates(x, output_fmt='NHWC')
    assert _close(final_hwc.permute(0, 3, 1, 2), final)
    for a, b in zip(maps_hwc, maps):
        assert _close(a.permute(0, 3, 1, 2), b)
    with pytest.raises(ValueError, match='output_fmt'):
        model.forward_intermediates(x, output_fmt='NLC')


# ----------------------------------------------- prune_intermediate_layers
def test_prune_to_an_earlier_level_drops_later_levels_norm_and_head():
    model = _tiny()
    full = copy.deepcopy(model)
    kept = model.prune_intermediate_layers([0, 1])
    assert kept == [0, 1]
    assert len(model.levels) == 2
    assert not any(k.startswith(('levels.2', 'levels.3', 'norm.', 'head.'))
                   for k in model.state_dict())
    assert model.num_classes == 0
    assert model.num_features == model.head_hidden_size == DIMS[1]
    x = _x()
    with torch.no_grad():
        level1 = full.forward_intermediates(x, indices=[1],
                                            intermediates_only=True)[0]
        # forward_features ends at the last kept level, the head is gone,
        # and the pooling with it (reset_classifier(0, ''))
        assert _close(model.forward_features(x), level1)
        assert _close(model(x), level1)
        final, maps = model.forward_intermediates(x)
        assert _close(final, level1) and len(maps) == 2


def test_prune_keeping_the_last_level():
    model = _tiny()
    assert model.prune_intermediate_layers(2) == [2, 3]
    assert len(model.levels) == 4
    assert model.num_classes == 0  # prune_head defaults to True
    assert isinstance(model.norm, torch.nn.LayerNorm)
    assert model.num_features == DIMS[-1]
    kept_head = _tiny()
    kept_head.prune_intermediate_layers(prune_head=False)
    assert kept_head.num_classes == 7
    assert isinstance(kept_head.get_classifier(), torch.nn.Linear)
    no_norm = _tiny()
    no_norm.prune_intermediate_layers(prune_norm=True)
    assert isinstance(no_norm.norm, torch.nn.Identity)


def test_prune_rejects_out_of_range_indices():
    model = _tiny()
    with pytest.raises(AssertionError, match='out of range'):
        model.prune_intermediate_layers([4])
    assert len(model.levels) == 4 and model.num_classes == 7


# ------------------------------------------------------------ timm utilities
def _train_step(model, x):
    """Output, gradients, and how many values autograd saved for backward."""
    model.train()
    model.zero_grad()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = model(x)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()], \
        sum(saved)


def test_set_grad_checkpointing_saves_activations_with_equal_results():
    model = _tiny(drop_path_rate=0.0)
    x = _x(batch=4)
    # per sample (a batch of 4 against one of 2): what every forward keeps
    # of the gates' weights depends on the parameters alone
    plain, plain_grads, plain_total = _train_step(model, x)
    plain_saved = plain_total - _train_step(model, x[:2])[2]
    model.set_grad_checkpointing()
    assert all(level.with_cp for level in model.levels)
    ckpt, ckpt_grads, ckpt_saved = _train_step(model, x)
    ckpt_saved -= _train_step(model, x[:2])[2]
    # the blocks' activations are recomputed in backward, not kept (the
    # stem's and the head's still are)
    assert ckpt_saved < plain_saved * 0.7
    assert _close(plain, ckpt)
    for a, b in zip(plain_grads, ckpt_grads):
        assert _close(a, b, tol=1e-6)
    model.set_grad_checkpointing(False)
    assert not any(level.with_cp for level in model.levels)
    assert _train_step(model, x)[2] == plain_total


def _module_of(name: str, coarse: bool) -> str:
    parts = name.split('.')
    if parts[0] != 'levels':
        return parts[0]
    if coarse:
        return '.'.join(parts[:2])
    return '.'.join(parts[:3] if parts[2] == 'pool' else parts[:4])


@pytest.mark.parametrize('coarse,expected', [
    (False, [['absolute_pos_embed', 'patch_embed'], ['levels.0.encoder.0'],
             ['levels.1.encoder.0', 'levels.1.pool'],
             ['levels.2.encoder.0', 'levels.2.pool'], ['levels.2.encoder.1'],
             ['levels.3.encoder.0', 'levels.3.pool', 'norm'], ['head']]),
    (True, [['absolute_pos_embed', 'patch_embed'], ['levels.0'],
            ['levels.1'], ['levels.2'], ['levels.3'], ['head', 'norm']]),
])
def test_group_matcher_orders_stem_blocks_head(coarse, expected):
    model = PosMLPClassifier(TINY_ARCH, num_classes=7, ape=True)
    groups = group_parameters(model, model.group_matcher(coarse))
    named = [sorted({_module_of(n, coarse) for n in names})
             for _, names in sorted(groups.items())]
    assert named == expected


def test_no_weight_decay_follows_the_published_recipe():
    """The authors' model names no exempt parameters: timm exempts 1-D
    tensors and biases by itself, and decays the gate's parameters."""
    model = _tiny()
    assert model.no_weight_decay() == set()
    optimizer = timm.optim.create_optimizer_v2(model, 'adamw',
                                               weight_decay=0.05)
    decayed = {id(p) for g in optimizer.param_groups
               if g['weight_decay'] > 0 for p in g['params']}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert 'levels.0.encoder.0.gate_unit.pos.attention_centers' in names
    assert 'head.weight' in names
    assert not any(n.endswith('.bias') or n.startswith('norm.')
                   for n in names)


def test_set_input_size_records_the_size_and_changes_nothing_else():
    model = _tiny()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    x = _x()
    with torch.no_grad():
        before = model(x)
        model.set_input_size(img_size=(96, 128))
        assert _close(model(x), before, tol=0)
    assert all(torch.equal(state[k], v) for k, v in
               model.state_dict().items())
    assert get_model_input_config(model)['input_size'] == (3, 96, 128)
    model.set_input_size(80)
    assert get_model_input_config(model)['input_size'] == (3, 80, 80)
    model.set_input_size()  # None: unchanged
    assert get_model_input_config(model)['input_size'] == (3, 80, 80)
    for bad in (0, (96,), (96, -1), 'big'):
        with pytest.raises(ValueError, match='img_size'):
            model.set_input_size(bad)
    with pytest.raises(TypeError):
        model.set_input_size((96, 96), window_size=7)


# ------------------------------------------------- through timm's registry
def test_create_model_without_head_and_pooling_returns_the_map():
    model = timm.create_model('posmlp_t', num_classes=0,
                              global_pool='').eval()
    x = _x(size=(64, 64), batch=1)
    with torch.no_grad():
        out = model(x)
        assert _close(out, model.forward_features(x))
    assert out.shape == (1, 768, 2, 2)
    pooled = timm.create_model('posmlp_t', num_classes=0).eval()
    with torch.no_grad():
        assert pooled(x).shape == (1, pooled.head_hidden_size) == (1, 768)


def test_create_model_takes_a_custom_arch():
    """As with timm's own variants, a keyword overrides the variant's
    default: here the architecture (a dict, or another variant's name)."""
    model = timm.create_model('posmlp_t', arch=TINY_ARCH, num_classes=5)
    assert [level.encoder[0].norm.normalized_shape[0]
            for level in model.levels] == list(DIMS)
    assert model.head.out_features == 5
    small = timm.create_model('posmlp_t', arch='s', num_classes=0)
    assert small.num_features == 1024
    with pytest.raises(KeyError, match='unknown PosMLP arch'):
        timm.create_model('posmlp_t', arch='not_an_arch')


def test_create_model_refuses_unknown_arguments():
    with pytest.raises(TypeError):
        timm.create_model('posmlp_t', not_an_option=1)
    with pytest.raises(ValueError, match='global_pool'):
        timm.create_model('posmlp_t', global_pool='token')


def test_feature_getter_prunes_and_validates_out_indices():
    """timm's features_only wrapper (FeatureGetterNet) on the classifier."""
    model = _tiny()
    feats = FeatureGetterNet(copy.deepcopy(model), out_indices=(1, 2)).eval()
    assert len(feats.model.levels) == 3
    assert feats.feature_info.channels() == list(DIMS[1:3])
    assert feats.feature_info.reduction() == [8, 16]
    x = _x()
    with torch.no_grad():
        want = model.forward_intermediates(x, indices=[1, 2],
                                           intermediates_only=True)
        got = feats(x)
    assert len(got) == 2 and all(_close(a, b) for a, b in zip(got, want))
    last = FeatureGetterNet(copy.deepcopy(model), out_indices=(-1,))
    assert last.feature_info.channels() == [DIMS[-1]]
    for bad in ((5,), (0, 4), (-5,)):
        with pytest.raises(AssertionError, match='out of range'):
            FeatureGetterNet(copy.deepcopy(model), out_indices=bad)


def test_create_model_features_only():
    feats = timm.create_model('posmlp_t', features_only=True,
                              out_indices=(0, 1)).eval()
    assert len(feats.model.levels) == 2
    assert feats.feature_info.channels() == [96, 192]
    with torch.no_grad():
        outs = feats(_x(size=(64, 64), batch=1))
    assert [tuple(o.shape) for o in outs] == [(1, 96, 16, 16),
                                              (1, 192, 8, 8)]
    with pytest.raises(AssertionError, match='out of range'):
        timm.create_model('posmlp_t', features_only=True, out_indices=(5,))


def test_pretrained_cfgs_follow_the_published_release_and_recipe():
    t = timm.create_model('posmlp_t')
    cfg = t.pretrained_cfg
    assert cfg['tag'] == 'in1k'
    assert 'drive.google.com' in cfg['notes'][0]
    assert cfg['origin_url'] == 'https://github.com/Zhicaiwww/PosMLP'
    data = timm.data.resolve_data_config(model=t)
    assert data['input_size'] == (3, 224, 224)
    assert data['crop_pct'] == 0.9
    assert data['interpolation'] == 'bicubic'
    assert data['mean'] == timm.data.IMAGENET_DEFAULT_MEAN
    assert data['std'] == timm.data.IMAGENET_DEFAULT_STD
    state = t.state_dict()
    assert cfg['first_conv'] + '.weight' in state
    assert cfg['classifier'] + '.weight' in state
    for name in ('posmlp_s', 'posmlp_b'):
        assert timm.models.get_pretrained_cfg(name).tag == 'untrained'
        with pytest.raises(ValueError, match='No released weights'):
            timm.create_model(name, pretrained=True)
    with pytest.raises(ValueError, match='drive.google.com'):
        timm.create_model('posmlp_t', pretrained=True)


@pytest.fixture(scope='module')
def released_t(tmp_path_factory):
    """A PosMLP-T checkpoint in the released format (timm's saver: EMA and
    raw weights, training args), with a derived buffer as released files
    have them: the checked loader drops it, a strict state-dict load would
    fail on it."""
    import argparse
    torch.manual_seed(2)
    model = timm.create_model('posmlp_t')
    randomize_(model)
    ema = dict(model.state_dict())
    ema['levels.0.encoder.0.gate_unit.pos.rel_indices'] = torch.zeros(
        196, 196, 5)
    path = tmp_path_factory.mktemp('release') / 'posmlp_t.pth'
    torch.save(dict(state_dict={k: v + 1 for k, v in ema.items()},
                    state_dict_ema=ema, epoch=299,
                    args=argparse.Namespace(model='posmlp_t')), path)
    return path, ema


def _backbone_equal(model, weights):
    return all(torch.equal(v, weights[k]) for k, v in
               model.state_dict().items() if not k.startswith('head.'))


def test_pretrained_file_loads_the_ema_weights(released_t):
    path, ema = released_t
    model = timm.create_model('posmlp_t', pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(path)))
    assert _backbone_equal(model, ema)
    assert torch.equal(model.head.weight, ema['head.weight'])


def test_pretrained_file_with_another_class_count_keeps_the_new_head(
        released_t):
    path, ema = released_t
    model = timm.create_model('posmlp_t', pretrained=True, num_classes=10,
                              pretrained_cfg_overlay=dict(file=str(path)))
    assert _backbone_equal(model, ema)
    assert model.head.weight.shape == (10, 768)


def test_pretrained_file_loads_before_features_only_prunes(released_t):
    path, ema = released_t
    feats = timm.create_model('posmlp_t', pretrained=True, features_only=True,
                              out_indices=(0, 1),
                              pretrained_cfg_overlay=dict(file=str(path)))
    assert len(feats.model.levels) == 2
    assert _backbone_equal(feats.model, ema)


def test_pretrained_file_that_does_not_fit_is_refused(released_t,
                                                       tmp_path):
    path, ema = released_t
    broken = tmp_path / 'broken.pth'
    torch.save(dict(state_dict_ema={k: v for k, v in ema.items()
                                    if k != 'levels.1.pool.conv.weight'}),
               broken)
    with pytest.raises(CheckpointError, match='levels.1.pool.conv.weight'):
        timm.create_model('posmlp_t', pretrained=True, features_only=True,
                          pretrained_cfg_overlay=dict(file=str(broken)))
