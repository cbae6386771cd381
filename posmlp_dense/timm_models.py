"""timm registration: ``timm.create_model('posmlp_t' | 'posmlp_s' | 'posmlp_b')``.

``features_only=True`` works through timm's feature getter (the classifier's
``forward_intermediates``). No weights can be downloaded; to start from a
released checkpoint pass ``pretrained=True`` with
``pretrained_cfg_overlay=dict(file='path/to/checkpoint.pth')``, or call
``posmlp_dense.load_pretrained`` on the model.
"""
from __future__ import annotations

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs
from timm.models import register_model

from .checkpoint import load_pretrained
from .classifier import PosMLPClassifier


def _cfg(**kwargs):
    return dict(num_classes=1000, input_size=(3, 224, 224), pool_size=(7, 7),
                crop_pct=0.875, interpolation='bicubic',
                mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
                first_conv='patch_embed.projs.0', classifier='head', **kwargs)


default_cfgs = generate_default_cfgs({
    'posmlp_t.untrained': _cfg(),
    'posmlp_s.untrained': _cfg(),
    'posmlp_b.untrained': _cfg(),
})


class _TimmPosMLP(PosMLPClassifier):
    """Accepts timm's argument names (``in_chans``, ``global_pool``)."""

    def __init__(self, arch='t', in_chans: int = 3, global_pool: str = 'avg',
                 **kwargs):
        if global_pool not in ('avg', ''):
            raise ValueError(f"PosMLP supports global_pool='avg' only, got "
                             f'{global_pool!r}')
        super().__init__(arch, in_channels=in_chans, **kwargs)


def _create(variant: str, arch: str, pretrained: bool = False, **kwargs):
    overlay = kwargs.get('pretrained_cfg_overlay') or {}
    if pretrained and not overlay.get('file'):
        raise ValueError(
            f'{variant}: no weights can be downloaded; pass '
            f"pretrained_cfg_overlay=dict(file='released_checkpoint.pth')")
    features_only = kwargs.get('features_only', False)
    model = build_model_with_cfg(
        _TimmPosMLP, variant, False, arch=arch,
        feature_cfg=dict(feature_cls='getter', out_indices=(0, 1, 2, 3)),
        **kwargs)
    if pretrained:
        target = model.model if features_only else model
        load_pretrained(target, overlay['file'])
    return model


@register_model
def posmlp_t(pretrained: bool = False, **kwargs):
    """PosMLP-T (20.9M parameters, 82.1 top-1 as published)."""
    return _create('posmlp_t', 't', pretrained, **kwargs)


@register_model
def posmlp_s(pretrained: bool = False, **kwargs):
    """PosMLP-S (36.8M parameters, 83.0 top-1 as published)."""
    return _create('posmlp_s', 's', pretrained, **kwargs)


@register_model
def posmlp_b(pretrained: bool = False, **kwargs):
    """PosMLP-B (82.0M parameters, 83.6 top-1 as published)."""
    return _create('posmlp_b', 'b', pretrained, **kwargs)
