"""The OpenMMLab side of the tests: the demo configs, their registries,
the built-in data written small, and short runs of a config on it."""
from __future__ import annotations

import os.path as osp
import uuid

from mmengine.config import Config
from mmengine.registry import init_default_scope

from posmlp_dense.data import shapes as demo_data

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_DET = osp.join(ROOT, 'configs', 'demo',
                    'retinanet_posmlp_t_fpn_demo-shapes.py')
DEMO_SEG = osp.join(ROOT, 'configs', 'demo', 'fpn_posmlp_t_demo-shapes.py')


def models_registry(cfg):
    init_default_scope(cfg.default_scope)
    if cfg.default_scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    return MODELS


def write_demo_data(root):
    """The built-in detection and segmentation sets, 8 training and 4
    validation images each, under ``root`` (coco/, ade/)."""
    demo_data.make_detection_set(str(root / 'coco'), num_train=8, num_val=4,
                                 seed=3)
    demo_data.make_segmentation_set(str(root / 'ade'), num_train=8,
                                    num_val=4, seed=3)
    return root


def small_run_cfg(config, data_root, work_dir, length):
    cfg = Config.fromfile(config)
    cfg.work_dir = str(work_dir)
    cfg.experiment_name = f'test_{uuid.uuid4().hex[:8]}'
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg[key]
        loader.batch_size = 4
        loader.num_workers = 0
        loader.persistent_workers = False
    if cfg.default_scope == 'mmdet':
        root = str(data_root / 'coco') + '/'
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            cfg[key].dataset.data_root = root
        cfg.val_evaluator.ann_file = root + 'annotations/instances_val.json'
        cfg.test_evaluator = cfg.val_evaluator
        cfg.train_cfg.max_epochs = length
        cfg.train_cfg.val_interval = length
        cfg.default_hooks.checkpoint.interval = 1
        # a few iterations leave every score under the default 0.05; keep
        # all detections so that COCO mAP is computed, not skipped
        cfg.model.test_cfg.score_thr = 0.0
    else:
        for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            cfg[key].dataset.data_root = str(data_root / 'ade')
        cfg.train_cfg.max_iters = length
        cfg.train_cfg.val_interval = length
        cfg.default_hooks.checkpoint.interval = 2
    cfg.default_hooks.logger.interval = 1
    return cfg
