"""The backbones the benchmark compares, built with random weights: PosMLP
from this package, Swin and ResNet-50 from mmdet's registry (mmdet is
needed only here), as a detector config builds them."""
from __future__ import annotations

from typing import Dict, Sequence

import torch
from torch import nn

ALL_MODELS = ('posmlp_t', 'posmlp_s', 'swin_t', 'swin_s', 'resnet50')
LABELS = {'posmlp_t': 'PosMLP-T', 'posmlp_s': 'PosMLP-S', 'swin_t': 'Swin-T',
          'swin_s': 'Swin-S', 'resnet50': 'ResNet-50'}


def mmdet_models():
    """mmdet's model registry, its modules registered and its scope set as
    a detector config would."""
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmdet')
    return MODELS


def _build(name: str, posmlp_arch) -> nn.Module:
    from posmlp_dense import PosMLP
    if name in ('posmlp_t', 'posmlp_s'):
        arch = (posmlp_arch or 't') if name == 'posmlp_t' else 's'
        # stochastic depth as in the detection configs
        return PosMLP(arch, out_indices=(0, 1, 2, 3), drop_path_rate=0.2)
    if name in ('swin_t', 'swin_s'):
        return mmdet_models().build(dict(
            type='SwinTransformer', embed_dims=96,
            depths=[2, 2, 6 if name == 'swin_t' else 18, 2],
            num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4,
            qkv_bias=True, drop_path_rate=0.2, patch_norm=True,
            out_indices=(0, 1, 2, 3), convert_weights=False))
    if name == 'resnet50':
        return mmdet_models().build(dict(
            type='ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3),
            frozen_stages=-1, norm_cfg=dict(type='BN'), norm_eval=False,
            style='pytorch'))
    raise ValueError(f'unknown model {name!r}; choose from '
                     f'{", ".join(ALL_MODELS)}')


def build_models(names: Sequence[str], posmlp_arch=None, seed: int = 0
                 ) -> Dict[str, nn.Module]:
    """The named models in eval mode, each built after seeding with
    ``seed``; ``posmlp_arch`` (a dict) replaces PosMLP-T's arch."""
    models = {}
    for name in names:
        torch.manual_seed(seed)
        models[name] = _build(name, posmlp_arch)
        models[name].eval()  # (some mmdet backbones' train() returns None)
    return models


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
