"""The models the benchmark compares, built with random weights.

PosMLP comes from this package; Swin and ResNet-50 from mmdet's registry
(mmdet is needed only here), exactly as a detector config builds them.
"""
from __future__ import annotations

from typing import Dict, Sequence

import torch
from torch import nn

from .published_port import PublishedPort

ALL_MODELS = ('posmlp_t', 'posmlp_s', 'swin_t', 'swin_s', 'resnet50',
              'published_port')
LABELS = {
    'posmlp_t': 'PosMLP-T', 'posmlp_s': 'PosMLP-S', 'swin_t': 'Swin-T',
    'swin_s': 'Swin-S', 'resnet50': 'ResNet-50',
    'published_port': 'PosMLP-T published port',
}


def mmdet_models():
    """mmdet's model registry, with its modules registered and its scope
    set as a detector config would."""
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmdet')
    return MODELS


def _swin(depths: Sequence[int], with_cp: bool) -> nn.Module:
    return mmdet_models().build(dict(
        type='SwinTransformer', embed_dims=96, depths=list(depths),
        num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4, qkv_bias=True,
        drop_path_rate=0.2, patch_norm=True, out_indices=(0, 1, 2, 3),
        with_cp=with_cp, convert_weights=False))


def _resnet50(with_cp: bool) -> nn.Module:
    return mmdet_models().build(dict(
        type='ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3),
        frozen_stages=-1, norm_cfg=dict(type='BN'), norm_eval=False,
        style='pytorch', with_cp=with_cp))


def build_models(names: Sequence[str], posmlp_arch=None, seed: int = 0,
                 with_cp: bool = False) -> Dict[str, nn.Module]:
    """Build the requested models (random initialization, fixed seed).

    ``posmlp_arch`` (a dict) replaces the arch of ``posmlp_t`` and of the
    published port; the port always shares the weights of ``posmlp_t``.
    PosMLP and Swin get stochastic depth 0.2, as in their detection
    configs. ``with_cp``: gradient checkpointing of every block (not for
    the published port).
    """
    from posmlp_dense import PosMLP
    if with_cp and 'published_port' in names:
        raise ValueError('the published port has no gradient checkpointing '
                         '(with_cp)')
    models: Dict[str, nn.Module] = {}
    posmlp_t = None
    for name in names:
        torch.manual_seed(seed)
        if name in ('posmlp_t', 'published_port'):
            if posmlp_t is None:
                posmlp_t = PosMLP(posmlp_arch or 't', out_indices=(0, 1, 2, 3),
                                  drop_path_rate=0.2, with_cp=with_cp)
            model = posmlp_t if name == 'posmlp_t' else PublishedPort(posmlp_t)
        elif name == 'posmlp_s':
            model = PosMLP('s', out_indices=(0, 1, 2, 3), drop_path_rate=0.2,
                           with_cp=with_cp)
        elif name == 'swin_t':
            model = _swin((2, 2, 6, 2), with_cp)
        elif name == 'swin_s':
            model = _swin((2, 2, 18, 2), with_cp)
        elif name == 'resnet50':
            model = _resnet50(with_cp)
        else:
            raise ValueError(f'unknown model {name!r}; choose from '
                             f'{", ".join(ALL_MODELS)}')
        model.eval()  # (some mmdet backbones' train() returns None)
        models[name] = model
    return models


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

