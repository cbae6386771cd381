"""The classifier a pretraining run trains, and how to rebuild it.

Published variants come from timm (``timm.create_model('posmlp_t', ...)``,
registered by posmlp_dense). A custom architecture (e.g. the small backbone
of the CPU demos) is given as PosMLP arguments, directly or read from the
backbone of an mmdet/mmseg config, so that the detector built from that
config loads the pretrained weights key for key.
"""
from __future__ import annotations

import json
from typing import Optional

import timm
from torch import nn

from ..classifier import create_posmlp_classifier

MODELS = ('posmlp_t', 'posmlp_s', 'posmlp_b')
# PosMLP arguments that decide which weights exist (the rest, such as
# out_indices or frozen_stages, only matter for dense prediction).
ARCH_KEYS = ('arch', 'gate', 'window_size', 'pos_only', 'gqpe_generalized',
             'shift', 'ape', 'ape_grid')


def parse_arch(text: str) -> dict:
    """``--arch``: a JSON dict of PosMLP arguments, or only the arch dict."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f'--arch must be JSON, e.g. \'{{"embed_dims": '
                         f'[32, 64, 128, 256], ...}}\': {err}') from None
    if not isinstance(value, dict):
        raise ValueError(f'--arch must be a JSON object, got {text!r}')
    if 'arch' not in value:
        value = dict(arch=value)
    return _arch_kwargs(value, '--arch')


def arch_from_config(path: str) -> dict:
    """The PosMLP arguments of the backbone in an mmdet/mmseg config."""
    from mmengine.config import Config
    cfg = Config.fromfile(path)
    backbone = (cfg.get('model') or {}).get('backbone')
    kind = backbone.get('type') if isinstance(backbone, dict) else None
    if str(kind).rsplit('.', 1)[-1] != 'PosMLP':
        raise ValueError(f'{path}: model.backbone is not a PosMLP (type '
                         f'{kind!r})')
    return _arch_kwargs(backbone.to_dict(), path)


def _arch_kwargs(source: dict, where: str) -> dict:
    kwargs = {k: source[k] for k in ARCH_KEYS if k in source}
    arch = kwargs.get('arch', 't')
    if isinstance(arch, dict):  # tuples survive a JSON round trip as lists
        kwargs['arch'] = {k: list(v) if isinstance(v, (tuple, list)) else v
                          for k, v in arch.items()}
    unknown = set(source) - set(ARCH_KEYS) if where.startswith('--') \
        else set()
    if unknown:
        raise ValueError(f'{where}: unknown PosMLP arguments '
                         f'{sorted(unknown)}; allowed: {list(ARCH_KEYS)}')
    return json.loads(json.dumps(kwargs))  # plain lists, for checkpoints


def build_classifier(model: str, num_classes: int, drop_rate: float,
                     drop_path_rate: float,
                     arch_kwargs: Optional[dict] = None) -> nn.Module:
    """``posmlp_t/s/b`` through timm, or a custom PosMLP classifier."""
    if arch_kwargs:
        return create_posmlp_classifier(num_classes=num_classes,
                                        drop_rate=drop_rate,
                                        drop_path_rate=drop_path_rate,
                                        **arch_kwargs)
    if model not in MODELS:
        raise ValueError(f'unknown model {model!r}; expected one of {MODELS}')
    return timm.create_model(model, num_classes=num_classes,
                             drop_rate=drop_rate,
                             drop_path_rate=drop_path_rate)


def model_args(model: str, num_classes: int,
               arch_kwargs: Optional[dict]) -> dict:
    """What the checkpoint records to rebuild (and to check on resume)."""
    return dict(model=model, num_classes=num_classes,
                arch_kwargs=arch_kwargs or None)
