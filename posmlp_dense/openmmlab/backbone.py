"""PosMLP as an OpenMMLab backbone (one class for mmdet and mmseg).

The model is the pure-PyTorch ``posmlp_dense.PosMLP``; this adds mmengine's
``BaseModule`` (``init_cfg``) and handles ``init_cfg=dict(type='Pretrained',
checkpoint=..., prefix=..., which='ema')`` with the package's own checked
loader, so a released ImageNet checkpoint works as it is (its EMA weights,
derived buffers dropped, tables resized to the configured windows) as well
as a converted one or a detector/segmentor checkpoint (``prefix``). The key
report goes to the runner's log.

``pretrained=PATH`` (deprecated) is read as that ``init_cfg``. Another
backbone's weights, which mmseg passes on from a base config's
``model.pretrained`` (``open-mmlab://resnet50_v1c``, a URL), are refused when
the model is built, with the fix: ``model.pretrained=None``.
"""
from __future__ import annotations

import copy
import logging
import warnings

from mmengine.logging import print_log
from mmengine.model import BaseModule

from ..backbone import PosMLP
from ..checkpoint import load_pretrained


class MMPosMLP(PosMLP, BaseModule):
    """``PosMLP`` with ``init_cfg``; every other argument is PosMLP's."""

    def __init__(self, *args, init_cfg=None, pretrained=None, **kwargs):
        if pretrained is not None:
            init_cfg = _init_cfg_from_pretrained(pretrained, init_cfg)
        super().__init__(*args, **kwargs)
        self.init_cfg = copy.deepcopy(init_cfg)
        self.load_report = None

    def init_weights(self):
        cfg = self.init_cfg
        if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained':
            unknown = set(cfg) - {'type', 'checkpoint', 'prefix', 'which',
                                  'map_location'}
            if unknown:
                raise ValueError(f'unknown Pretrained init_cfg keys '
                                 f'{sorted(unknown)} for PosMLP')
            self.load_report = load_pretrained(
                self, cfg['checkpoint'], which=cfg.get('which', 'ema'),
                prefix=cfg.get('prefix'))
            print_log(f'PosMLP pretrained weights:\n{self.load_report}',
                      logger='current', level=logging.INFO)
            self._is_init = True
        elif cfg is not None:
            super().init_weights()  # mmengine's initializers (Kaiming, ...)
        else:
            self._is_init = True  # __init__ already applied the published init


# How mmseg's EncoderDecoder (and other models that take ``pretrained``)
# reach the backbone: model.pretrained becomes backbone.pretrained.
_FIX = ('If it comes from a base config (e.g. mmseg\'s '
        '_base_/models/upernet_r50.py sets model.pretrained to ResNet\'s '
        'weights, which mmseg hands to the backbone), set '
        'model.pretrained=None in your config (or --cfg-options '
        'model.pretrained=None) and give PosMLP its weights with '
        "backbone.init_cfg=dict(type='Pretrained', checkpoint=...).")


def _init_cfg_from_pretrained(pretrained, init_cfg):
    """The deprecated ``pretrained=PATH`` as ``init_cfg``; another
    backbone's weights are refused before anything is built."""
    if not isinstance(pretrained, str) or '://' in pretrained:
        # open-mmlab://, torchvision://, http(s)://: never a PosMLP
        # checkpoint that the local loader could read
        raise ValueError(f'PosMLP got pretrained={pretrained!r}, which is not '
                         f'a PosMLP checkpoint file. {_FIX}')
    if init_cfg is not None:
        raise ValueError(f'PosMLP got both init_cfg={init_cfg!r} and '
                         f'pretrained={pretrained!r}; give only init_cfg. '
                         f'{_FIX}')
    warnings.warn('PosMLP: pretrained= is deprecated, use init_cfg=dict('
                  "type='Pretrained', checkpoint=...)")
    return dict(type='Pretrained', checkpoint=pretrained)
