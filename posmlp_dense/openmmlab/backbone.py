"""PosMLP as an OpenMMLab backbone (one class for mmdet and mmseg).

The model is the pure-PyTorch ``posmlp_dense.PosMLP``; this adds mmengine's
``BaseModule`` (``init_cfg``) and handles ``init_cfg=dict(type='Pretrained',
checkpoint=..., prefix=..., which='ema')`` with the package's own checked
loader, so a released ImageNet checkpoint works as it is (its EMA weights,
derived buffers dropped, tables resized to the configured windows) as well
as a converted one or a detector/segmentor checkpoint (``prefix``). The key
report goes to the runner's log.
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
        super().__init__(*args, **kwargs)
        if pretrained is not None:
            if init_cfg is not None:
                raise ValueError('give either init_cfg or pretrained, not '
                                 'both')
            warnings.warn('pretrained= is deprecated, use init_cfg=dict('
                          "type='Pretrained', checkpoint=...)")
            init_cfg = dict(type='Pretrained', checkpoint=pretrained)
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
