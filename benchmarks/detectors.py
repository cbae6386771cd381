"""RetinaNet-PosMLP-T against RetinaNet-Swin-T: mmdet's Swin-T config, and
the same with only its backbone replaced (same FPN neck and head), on
random images with random boxes."""
from __future__ import annotations

import os
from typing import Callable, Optional, Sequence, Tuple

import torch
from torch import nn

from .models import mmdet_models

DETECTOR_BACKBONES = ('posmlp_t', 'swin_t')
DETECTOR_LABELS = {'posmlp_t': 'RetinaNet-PosMLP-T',
                   'swin_t': 'RetinaNet-Swin-T'}
SWIN_RETINANET_CONFIG = 'swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py'
BOXES_PER_IMAGE = 8


def build_detector(backbone: str, posmlp_arch: Optional[dict] = None
                   ) -> nn.Module:
    """RetinaNet with ``backbone`` (PosMLP-T as in
    configs/retinanet_posmlp_t_fpn_1x_coco.py), random weights through
    ``init_weights`` (the head's prior bias as in training)."""
    import mmdet
    from mmengine.config import Config
    import posmlp_dense  # noqa: F401  (registers PosMLP with mmdet)
    path = os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs',
                        SWIN_RETINANET_CONFIG)
    cfg = Config.fromfile(path).model
    if backbone == 'posmlp_t':
        cfg.backbone = dict(type='PosMLP', arch=posmlp_arch or 't',
                            gate='gqpe', out_indices=(1, 2, 3),
                            drop_path_rate=0.2)
        if posmlp_arch is not None:  # the neck takes its widths
            cfg.neck.in_channels = list(posmlp_arch['embed_dims'])[1:]
    elif backbone == 'swin_t':
        cfg.backbone.init_cfg = None  # no download of ImageNet weights
    else:
        raise ValueError(f'no RetinaNet with backbone {backbone!r}; choose '
                         f'from {", ".join(DETECTOR_BACKBONES)}')
    model = mmdet_models().build(cfg)
    model.init_weights()
    return model


def detection_batch(shape: Sequence[int], seed: int) -> dict:
    """``shape`` = (images, height, width): random uint8 images with random
    boxes, as a data loader hands them to ``train_step``."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    batch, h, w = shape
    gen = torch.Generator().manual_seed(seed)
    size = torch.tensor([w, h], dtype=torch.float32)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen,
                                    dtype=torch.uint8))
        corner = torch.rand(BOXES_PER_IMAGE, 2, generator=gen) * 0.8 * size
        extent = (0.05 + 0.15 * torch.rand(BOXES_PER_IMAGE, 2,
                                           generator=gen)) * size
        sample = DetDataSample(metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([corner, torch.minimum(corner + extent, size)],
                             1),
            labels=torch.randint(0, 80, (BOXES_PER_IMAGE,), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def training_iteration(backbone: str, shape: Tuple[int, int, int],
                       device: torch.device, seed: int = 0,
                       posmlp_arch: Optional[dict] = None
                       ) -> Tuple[Callable[[], object], nn.Module, dict]:
    """(one ``model.train_step`` with AdamW: preprocessing, forward,
    losses, backward, update; the model in train mode; its batch)."""
    from mmengine.optim import OptimWrapper
    torch.manual_seed(seed)
    model = build_detector(backbone, posmlp_arch).to(device).train()
    data = detection_batch(shape, seed)
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-4,
                                           weight_decay=0.05))
    return (lambda: model.train_step(data, optim)), model, data
