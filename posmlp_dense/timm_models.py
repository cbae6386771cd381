"""timm registration of posmlp_t, posmlp_s and posmlp_b (``timm.create_model``).

The models have timm's full model interface (see classifier.py);
``features_only=True`` wraps them in timm's feature getter, which prunes the
levels after the last of ``out_indices``.

Weights. The authors released PosMLP-T (ImageNet-1k, 82.1 top-1) as a file
on Google Drive and Baidu Pan, linked from their README; timm cannot fetch it.
Download it, then::

    timm.create_model('posmlp_t', pretrained=True,
                      pretrained_cfg_overlay=dict(file='path/to/file.pth'))

(``posmlp_dense.load_pretrained(model, path)`` does the same on any
PosMLP). The file goes through posmlp_dense's checked loader: the EMA
weights, weights-only unpickling, and an error naming the difference when
the file does not fit the model. With ``num_classes`` other than 1000 the
released head is left out and the new head keeps its initialization (timm's
rule for fine-tuning). PosMLP-S and -B have no released weights: their tag
is ``untrained``.

The data config is the published recipe (the authors' config/PosMLP_T.yaml
with timm 0.4.5's defaults for what it leaves empty): 224 x 224, bicubic,
crop_pct 0.9, ImageNet mean and std.
"""
from __future__ import annotations

from torch import nn
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import (build_model_with_cfg, generate_default_cfgs,
                         register_model, resolve_pretrained_cfg)

from .checkpoint import LoadReport, load_pretrained
from .classifier import PosMLPClassifier

RELEASE_PAGE = 'https://github.com/Zhicaiwww/PosMLP'
RELEASE_FILE_T = ('https://drive.google.com/file/d/'
                  '1wl0JzFqmdbhRAp2WEgl0dVFW5jnoS6bM/view')


def _cfg(**kwargs):
    return dict(
        num_classes=1000, input_size=(3, 224, 224), pool_size=(7, 7),
        fixed_input_size=False, crop_pct=0.9, interpolation='bicubic',
        mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
        first_conv='patch_embed.projs.0', classifier='head',
        custom_load=True,  # released files hold more than a state dict
        origin_url=RELEASE_PAGE, license='mit',
        paper_name='Parameterization of Cross-Token Relations with Relative '
                   'Positional Encoding for Vision MLP',
        paper_ids='arXiv:2207.07284', **kwargs)


default_cfgs = generate_default_cfgs({
    'posmlp_t.in1k': _cfg(
        description='PosMLP-T, ImageNet-1k, 82.1 top-1 (published)',
        notes=(f'Released as a file (Google Drive: {RELEASE_FILE_T}, or '
               f'Baidu Pan, both linked from {RELEASE_PAGE}); download it '
               f"and pass pretrained_cfg_overlay=dict(file='...')",)),
    'posmlp_s.untrained': _cfg(
        notes=('No released weights (the authors\' README: "released '
               'soon").',)),
    'posmlp_b.untrained': _cfg(notes=('No released weights.',)),
})


class _TimmPosMLP(PosMLPClassifier):
    """PosMLPClassifier under timm's argument names (``in_chans``), with
    the loading hook timm calls for ``custom_load`` weights."""

    def __init__(self, arch='t', in_chans: int = 3, **kwargs):
        super().__init__(arch, in_channels=in_chans, **kwargs)
        self.in_chans = in_chans

    def load_pretrained(self, path: str) -> LoadReport:
        """Load a released (or converted) checkpoint with the checked
        loader. When this model's class count differs from the released
        one, the released head is left out and this head is kept."""
        if self.num_classes == self.pretrained_cfg.get('num_classes'):
            return load_pretrained(self, path)
        # a model without a head skips the file's head (and reports it)
        head, self.head = self.head, nn.Identity()
        try:
            return load_pretrained(self, path)
        finally:
            self.head = head


def _create(variant: str, default_arch: str, pretrained: bool = False,
            **kwargs):
    if pretrained:
        # timm resets custom_load when a file is given; keep it, so that the
        # file goes through load_pretrained below (before features_only
        # wraps and prunes the model)
        overlay = dict(kwargs.get('pretrained_cfg_overlay') or {})
        overlay.setdefault('custom_load', True)
        kwargs['pretrained_cfg_overlay'] = overlay
        cfg = resolve_pretrained_cfg(
            variant, pretrained_cfg=kwargs.get('pretrained_cfg'),
            pretrained_cfg_overlay=overlay)
        if not cfg.has_weights:
            where = cfg.notes[0] if cfg.notes else ''
            raise ValueError(
                f'{variant}.{cfg.tag}: no weights can be downloaded. {where} '
                f"For a checkpoint file of your own pass pretrained_cfg_"
                f"overlay=dict(file='path/to/checkpoint.pth').")
    # out_indices only matter to features_only (timm's builder takes them
    # from kwargs there); the classifier itself has no output selection
    out_indices = kwargs.pop('out_indices', (0, 1, 2, 3))
    # as timm's own variants do, a keyword overrides the variant's default
    # (a custom ``arch`` dict, e.g. for a smaller test model)
    arch = kwargs.pop('arch', default_arch)
    return build_model_with_cfg(
        _TimmPosMLP, variant, pretrained, arch=arch,
        feature_cfg=dict(feature_cls='getter', out_indices=out_indices),
        **kwargs)


@register_model
def posmlp_t(pretrained: bool = False, **kwargs) -> PosMLPClassifier:
    """PosMLP-T (20.9M parameters, 82.1 top-1 as published)."""
    return _create('posmlp_t', 't', pretrained, **kwargs)


@register_model
def posmlp_s(pretrained: bool = False, **kwargs) -> PosMLPClassifier:
    """PosMLP-S (36.8M parameters, 83.0 top-1 as published)."""
    return _create('posmlp_s', 's', pretrained, **kwargs)


@register_model
def posmlp_b(pretrained: bool = False, **kwargs) -> PosMLPClassifier:
    """PosMLP-B (82.0M parameters, 83.6 top-1 as published)."""
    return _create('posmlp_b', 'b', pretrained, **kwargs)
