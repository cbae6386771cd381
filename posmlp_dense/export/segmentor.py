"""An mmseg segmentor's tensor forward as a module that can be exported.

``SegmentorLogits`` maps a batch of normalized images (what mmseg's data
preprocessor hands the model) to the decode head's logits: the segmentor's
``forward(inputs, mode='tensor')``. Preprocessing (mean/std, BGR->RGB,
padding) and the post-processing to a label map stay outside the graph, as
in mmdeploy; the logits are at the decode head's stride (1/4 for Semantic
FPN and UperNet). Two kinds of modules are swapped for equivalents whose
sizes stay symbolic, as they would otherwise only be right at the export
size: mmseg's ``Upsample`` (``mmseg_upsample.py``, Semantic FPN's head) and
``nn.AdaptiveAvgPool2d`` (``adaptive_pool.py``, UperNet's pyramid pooling).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from ..checkpoint import extract_state_dict
from .adaptive_pool import make_adaptive_pooling_symbolic
from .mmseg_upsample import make_upsampling_symbolic


class SegmentorLogits(nn.Module):
    """Normalized images (B, 3, H, W) -> decode-head logits (B, K, h, w).

    In the segmentor, mmseg's ``Upsample`` and ``nn.AdaptiveAvgPool2d``
    modules are replaced in place by ``SymbolicUpsample`` (same outputs) and
    ``SymbolicAdaptiveAvgPool2d`` (same up to float rounding);
    ``replaced`` counts them by the name of the module replaced.
    """

    def __init__(self, segmentor: nn.Module):
        super().__init__()
        self.segmentor = segmentor
        self.replaced = {
            'Upsample': make_upsampling_symbolic(segmentor),
            'AdaptiveAvgPool2d': make_adaptive_pooling_symbolic(segmentor)}

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.segmentor(inputs, mode='tensor')


def build_segmentor(config: str, checkpoint: Optional[str] = None,
                    cfg_options: Optional[dict] = None) -> nn.Module:
    """Build the config's segmentor with mmseg's registry, in eval mode.

    With ``checkpoint`` (a training checkpoint of this config) every weight
    is loaded, strictly; see ``build_openmmlab_model``.
    """
    return build_openmmlab_model(config, 'mmseg', 'segmentor', checkpoint,
                                 cfg_options)


def config_scope(config: str) -> Optional[str]:
    """The config's ``default_scope`` ('mmdet', 'mmseg', ...)."""
    from mmengine.config import Config
    return Config.fromfile(config).get('default_scope')


def build_openmmlab_model(config: str, scope: str, kind: str,
                          checkpoint: Optional[str] = None,
                          cfg_options: Optional[dict] = None) -> nn.Module:
    """Build the config's model with ``scope``'s registry (mmseg, mmdet), in
    eval mode.

    With ``checkpoint`` (a training checkpoint of this config, read with
    ``weights_only=True`` and mmengine's few checkpoint types allowed, as
    the opt-in training runtime reads them) every weight is loaded,
    strictly; without one the weights are the freshly initialized ones
    (``init_cfg`` is not applied, so no ImageNet file is needed). SyncBN
    layers become plain BatchNorm (mmengine's ``revert_sync_batchnorm``),
    which is what they compute in eval mode.
    """
    import importlib

    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope

    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if cfg.get('default_scope') != scope:
        raise ValueError(
            f'{config} is not an {scope} config (default_scope '
            f'{cfg.get("default_scope")!r})')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    model = revert_sync_batchnorm(registry.build(cfg.model))
    if checkpoint is not None:
        from ..openmmlab.runtime.safe_checkpoints import \
            load_from_local_weights_only
        state, _ = extract_state_dict(
            load_from_local_weights_only(checkpoint), 'raw')
        result = model.load_state_dict(state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ValueError(
                f'{checkpoint} does not fit the {kind} of {config}: '
                f'missing {result.missing_keys[:5]} '
                f'({len(result.missing_keys)} in all), unexpected '
                f'{result.unexpected_keys[:5]} '
                f'({len(result.unexpected_keys)} in all)')
    return model.eval()
