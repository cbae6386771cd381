"""A photograph prepared as the config prepares test images.

The config's test pipeline loads and resizes it (its annotation loading
dropped: a photograph has none), and the detector's data preprocessor
normalizes and pads it: the tensor is what the exported graph expects as
its input, and what mmdet's own model sees in testing.
"""
from __future__ import annotations

import os.path as osp

import torch


def prepare_photo(config: str, detector, path: str) -> torch.Tensor:
    """(1, 3, H, W) input tensor of the photograph at ``path``."""
    from mmcv.transforms import Compose
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    if not osp.isfile(path):
        raise FileNotFoundError(f'no image at {path}')
    cfg = Config.fromfile(config)
    pipeline = cfg.get('test_pipeline') or \
        cfg.test_dataloader.dataset.pipeline
    steps = [step for step in pipeline if step['type'] != 'LoadAnnotations']
    init_default_scope('mmdet')
    data = Compose(steps)(dict(img_path=path, img_id=0))
    with torch.no_grad():
        batch = detector.data_preprocessor(
            dict(inputs=[data['inputs']],
                 data_samples=[data['data_samples']]), False)
    return batch['inputs']
