"""OpenMMLab integration with the real registries, Runner, datasets and
metrics: configs, training, checkpoints, evaluation, resume, DDP."""
from __future__ import annotations

import copy
import glob
import json
import os
import os.path as osp
import pickle
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch

mmdet = pytest.importorskip('mmdet')
mmseg = pytest.importorskip('mmseg')

from mmengine.config import Config  # noqa: E402
from mmengine.runner import Runner  # noqa: E402
from mmengine.runner.checkpoint import _load_checkpoint  # noqa: E402

from posmlp_dense.checkpoint import read_checkpoint  # noqa: E402
from posmlp_dense.openmmlab import MMPosMLP  # noqa: E402

from conftest import TINY_ARCH, fixture_arch, fixture_path  # noqa: E402
from openmmlab_runs import (DEMO_DET, DEMO_SEG, ROOT,  # noqa: E402
                            models_registry, small_run_cfg, write_demo_data)

CONFIGS = sorted(glob.glob(osp.join(ROOT, 'configs', '*.py'))
                 + glob.glob(osp.join(ROOT, 'configs', 'demo', '*.py')))


def _cpu_friendly(cfg):
    """SyncBN needs a process group: plain BN for single-process tests."""
    for key in ('decode_head', 'auxiliary_head'):
        head = cfg.model.get(key)
        if head is not None and 'norm_cfg' in head:
            head.norm_cfg = dict(type='BN', requires_grad=True)


def _det_batch(model, masks):
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData
    h, w = 64, 96
    samples, images = [], []
    for i in range(2):
        sample = DetDataSample(metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        boxes = torch.tensor([[8.0, 6.0, 40.0, 50.0], [50.0, 20.0, 90.0, 60.0]])
        inst = InstanceData(bboxes=boxes, labels=torch.tensor([0, 1]))
        if masks:
            m = np.zeros((2, h, w), dtype=np.uint8)
            m[0, 6:50, 8:40] = 1
            m[1, 20:60, 50:90] = 1
            inst.masks = BitmapMasks(m, h, w)
        sample.gt_instances = inst
        samples.append(sample)
        images.append(torch.randint(0, 255, (3, h, w), dtype=torch.uint8))
    return model.data_preprocessor(dict(inputs=images, data_samples=samples),
                                   training=True)


def _seg_batch(model, num_classes):
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    h, w = 64, 96
    samples, images = [], []
    for i in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(h, w),
                                             ori_shape=(h, w)))
        label = torch.randint(0, num_classes, (1, h, w))
        sample.gt_sem_seg = PixelData(data=label)
        samples.append(sample)
        images.append(torch.randint(0, 255, (3, h, w), dtype=torch.uint8))
    return model.data_preprocessor(dict(inputs=images, data_samples=samples),
                                   training=True)


@pytest.mark.parametrize('path', CONFIGS,
                         ids=[osp.relpath(p, ROOT) for p in CONFIGS])
def test_config_builds_and_trains_one_step(path):
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.type == 'PosMLP'
    # the model, and the training runtime named explicitly
    assert cfg.custom_imports.imports == ['posmlp_dense',
                                          'posmlp_dense.openmmlab.runtime']
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'
    assert cfg.default_hooks.checkpoint.backend_args == dict(
        backend='local_atomic')
    assert cfg.model.get('pretrained') is None  # no other backbone's weights
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    wd_free = cfg.optim_wrapper.paramwise_cfg
    assert wd_free.norm_decay_mult == 0 and wd_free.bias_decay_mult == 0
    cfg.model.backbone.init_cfg = None  # no ImageNet weights in tests
    _cpu_friendly(cfg)
    if cfg.default_scope == 'mmseg':
        cfg.model.data_preprocessor.size = (64, 96)
    model = models_registry(cfg).build(cfg.model)
    assert isinstance(model.backbone, MMPosMLP)
    model.init_weights()
    model.train()
    if cfg.default_scope == 'mmdet':
        batch = _det_batch(model, masks='roi_head' in cfg.model)
    else:
        batch = _seg_batch(model, cfg.model.decode_head.num_classes)
    losses = model(**batch, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.backbone.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all()
                         for g in grads)


def test_optimizer_groups_exempt_positional_parameters_from_decay():
    from mmengine.optim import build_optim_wrapper
    cfg = Config.fromfile(DEMO_DET)
    model = models_registry(cfg).build(cfg.model)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    decay = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            decay[names[id(p)]] = group['weight_decay']
    pos = 'backbone.levels.0.encoder.0.gate_unit.pos.'
    for name in ('attention_centers', 'attention_spreads',
                 'token_proj_n_bias'):
        assert decay[pos + name] == 0.0
    assert decay['backbone.levels.0.encoder.0.norm.weight'] == 0.0
    assert decay['backbone.levels.0.encoder.0.proj_c_e.bias'] == 0.0
    assert decay['backbone.levels.0.encoder.0.proj_c_e.weight'] == 0.05


def test_init_cfg_loads_every_weight_of_a_released_checkpoint():
    cfg = Config.fromfile(DEMO_DET)  # same tiny arch as the fixtures
    cfg.model.backbone.init_cfg = dict(
        type='Pretrained', checkpoint=fixture_path('tiny_gqpe_official.pth'))
    model = models_registry(cfg).build(cfg.model)
    model.init_weights()
    released = read_checkpoint(
        fixture_path('tiny_gqpe_official.pth'))['state_dict_ema']
    ours = model.backbone.state_dict()
    compared = 0
    for key, value in ours.items():
        if key.startswith('norm'):
            continue  # output norms are new for dense prediction
        assert torch.equal(value, released[key]), key
        compared += 1
    assert compared == len([k for k in released if not k.startswith(
        ('head.', 'norm.')) and not k.endswith(
        ('rel_indices', 'relative_position_index'))])
    assert model.backbone.load_report.missing == [
        k for k in ours if k.startswith('norm')]


def test_registered_in_both_registries_with_scopes():
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG
    assert DET.get('PosMLP') is MMPosMLP and SEG.get('PosMLP') is MMPosMLP
    assert DET.get('mmdet.PosMLP') is MMPosMLP
    assert SEG.get('mmseg.PosMLP') is MMPosMLP
    backbone = DET.build(dict(type='PosMLP', arch='t', frozen_stages=1))
    assert backbone.eval() is backbone  # train() returns self
    assert not any(p.requires_grad for p in backbone.levels[0].parameters())


# docs/training.md's mmseg example: a user config that swaps the backbone of
# mmseg's UperNet R-50 base, whose model.pretrained is ResNet's weights.
SWAPPED_UPERNET = """
_base_ = ['mmseg::_base_/models/upernet_r50.py',
          'mmseg::_base_/default_runtime.py']
custom_imports = dict(imports=['posmlp_dense'], allow_failed_imports=False)
model = dict(
    backbone=dict(_delete_=True, type='PosMLP', arch={arch!r},
                  out_indices=(0, 1, 2, 3){init_cfg}),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=32,
                     num_classes=4),
    auxiliary_head=dict(in_channels=64, channels=16, num_classes=4))
"""


@pytest.mark.parametrize('with_init_cfg', [False, True])
def test_another_backbones_pretrained_from_a_base_config_names_the_fix(
        tmp_path, with_init_cfg):
    init_cfg = (f", init_cfg=dict(type='Pretrained', checkpoint="
                f"{fixture_path('tiny_gqpe_official.pth')!r})"
                if with_init_cfg else '')
    arch = fixture_arch('gqpe') if with_init_cfg else TINY_ARCH
    path = tmp_path / 'upernet_posmlp.py'
    path.write_text(SWAPPED_UPERNET.format(arch=arch, init_cfg=init_cfg))
    cfg = Config.fromfile(str(path))
    assert cfg.model.pretrained == 'open-mmlab://resnet50_v1c'  # the base's
    models = models_registry(cfg)
    # refused when the model is built, before anything is trained
    with pytest.raises(ValueError, match=r"PosMLP got pretrained='open-mmlab"
                                         r"://resnet50_v1c'.* set "
                                         r"model\.pretrained=None"):
        # (a copy: mmseg writes model.pretrained into the backbone's dict)
        models.build(copy.deepcopy(cfg.model))
    cfg.merge_from_dict({'model.pretrained': None})  # the fix it names
    model = models.build(cfg.model)
    assert isinstance(model.backbone, MMPosMLP)
    model.init_weights()
    assert (model.backbone.load_report is not None) == with_init_cfg


def test_deprecated_pretrained_path_loads_like_init_cfg():
    from mmseg.registry import MODELS
    checkpoint = fixture_path('tiny_gqpe_official.pth')
    with pytest.warns(UserWarning, match='pretrained= is deprecated'):
        backbone = MODELS.build(dict(type='mmseg.PosMLP',
                                     arch=fixture_arch('gqpe'),
                                     pretrained=checkpoint))
    assert backbone.init_cfg == dict(type='Pretrained', checkpoint=checkpoint)
    backbone.init_weights()
    assert backbone.load_report.loaded
    with pytest.raises(ValueError, match=r'both init_cfg=.* and pretrained='
                                         r'.*model\.pretrained=None'):
        MODELS.build(dict(type='mmseg.PosMLP', arch=fixture_arch('gqpe'),
                          pretrained=checkpoint,
                          init_cfg=dict(type='Pretrained',
                                        checkpoint=checkpoint)))


def test_package_log_records_reach_the_run_log(tmp_path):
    """With the runtime imported, what the package logs (e.g. a resized
    table) is written to the run's log file."""
    import logging
    import posmlp_dense.openmmlab.runtime  # noqa: F401
    from mmengine.logging import MMLogger
    log_file = tmp_path / 'run.log'
    MMLogger.get_instance(f'run_{uuid.uuid4().hex[:8]}',
                          log_file=str(log_file))
    logging.getLogger('posmlp_dense').info('resized a table (%d)', 7)
    assert 'resized a table (7)' in log_file.read_text()


# ------------------------------------------------------------ real runs
@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    return write_demo_data(tmp_path_factory.mktemp('demo_data'))


def _val_metrics(runner, prefix):
    hub = runner.message_hub
    return {k[len('val/'):]: v.current() for k, v in hub.log_scalars.items()
            if k.startswith('val/' + prefix)}


# docs/training.md's recipe for a training checkpoint opened without its
# config.
INFERENCER = r'''
import sys

from mmdet.apis import DetInferencer

path = sys.argv[1]
try:  # mmengine reads the weights before the config they carry
    DetInferencer(model=None, weights=path, device='cpu')
    print('without the runtime: loaded')
except Exception as err:  # noqa: BLE001
    print(f'without the runtime: {type(err).__name__}')
import posmlp_dense.openmmlab.runtime  # noqa: E402,F401  (the one line)
inferencer = DetInferencer(model=None, weights=path, device='cpu')
print(f'with the runtime: {type(inferencer.model.backbone).__name__}')
'''


def _run_tool(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep
               + os.environ.get('PYTHONPATH', ''))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_detector_trains_checkpoints_evaluates_resumes(data_root, tmp_path):
    cfg = small_run_cfg(DEMO_DET, data_root, tmp_path / 'det', length=2)
    runner = Runner.from_cfg(cfg)
    runner.train()
    metrics = _val_metrics(runner, 'coco/bbox_')
    assert 'coco/bbox_mAP' in metrics  # evaluated by pycocotools
    assert osp.isfile(tmp_path / 'det' / 'epoch_2.pth')
    # mmengine reads its checkpoint back (through the runtime's loader) with
    # weights_only=True, allowing only the few types it needs, and only
    # inside the loader: torch's process-wide allowlist is untouched
    path = str(tmp_path / 'det' / 'epoch_2.pth')
    assert _load_checkpoint(path)['meta']['epoch'] == 2
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)

    # tools/test.py on the checkpoint reproduces the reported metrics
    cfg_path = tmp_path / 'det_cfg.py'
    cfg.dump(str(cfg_path))
    out = tmp_path / 'det_metrics.json'
    res = _run_tool('tools/test.py', str(cfg_path),
                    str(tmp_path / 'det' / 'epoch_2.pth'), '--work-dir',
                    str(tmp_path / 'det_test'), '--out', str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    tested = json.loads(out.read_text())
    for key, value in metrics.items():
        assert tested[key] == pytest.approx(value, abs=1e-6), key

    # opened without its config: docs/training.md's one line makes it load
    res = _run_tool('-c', INFERENCER, path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert 'without the runtime: UnpicklingError' in res.stdout
    assert 'with the runtime: MMPosMLP' in res.stdout

    # resume: a longer schedule continues from the last checkpoint
    resumed_cfg = small_run_cfg(DEMO_DET, data_root, tmp_path / 'det',
                                 length=3)
    resumed_cfg.resume = True
    resumed = Runner.from_cfg(resumed_cfg)
    resumed.train()
    assert resumed.epoch == 3
    assert resumed.iter == 3 * 2  # 8 images / batch 4, nothing re-run
    logs = [open(f).read() for f in
            glob.glob(str(tmp_path / 'det' / '*' / '*.log'))]
    assert len(logs) == 2  # the first run and the resumed one
    assert sum('resumed epoch: 2' in log for log in logs) == 1


def test_segmentor_trains_checkpoints_evaluates_resumes(data_root, tmp_path):
    cfg = small_run_cfg(DEMO_SEG, data_root, tmp_path / 'seg', length=4)
    runner = Runner.from_cfg(cfg)
    runner.train()
    metrics = _val_metrics(runner, 'mIoU')
    assert 0.0 <= metrics['mIoU'] <= 100.0  # mmseg's IoUMetric
    assert osp.isfile(tmp_path / 'seg' / 'iter_4.pth')

    cfg_path = tmp_path / 'seg_cfg.py'
    cfg.dump(str(cfg_path))
    out = tmp_path / 'seg_metrics.json'
    res = _run_tool('tools/test.py', str(cfg_path),
                    str(tmp_path / 'seg' / 'iter_4.pth'), '--work-dir',
                    str(tmp_path / 'seg_test'), '--out', str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(out.read_text())['mIoU'] == pytest.approx(
        metrics['mIoU'], abs=1e-6)

    resumed_cfg = small_run_cfg(DEMO_SEG, data_root, tmp_path / 'seg',
                                 length=6)
    resumed_cfg.resume = True
    resumed = Runner.from_cfg(resumed_cfg)
    resumed.train()
    assert resumed.iter == 6
    # load_from (weights only, no optimizer state) works as well
    fresh_cfg = small_run_cfg(DEMO_SEG, data_root, tmp_path / 'seg2',
                               length=1)
    fresh_cfg.load_from = str(tmp_path / 'seg' / 'iter_6.pth')
    fresh = Runner.from_cfg(fresh_cfg)
    fresh.train()
    assert fresh.iter == 1


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_two_process_ddp_run_on_cpu(data_root, tmp_path):
    cfg = small_run_cfg(DEMO_DET, data_root, tmp_path / 'ddp', length=1)
    cfg.train_dataloader.batch_size = 2
    cfg_path = tmp_path / 'ddp_cfg.py'
    cfg.dump(str(cfg_path))
    env = dict(os.environ, PYTHON=sys.executable, PORT=str(_free_port()))
    res = subprocess.run(['bash', 'tools/dist_train.sh', str(cfg_path), '2'],
                         cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    log = open(glob.glob(str(tmp_path / 'ddp' / '*' / '*.log'))[-1]).read()
    assert 'world_size: 2' in log or 'Distributed launcher: pytorch' in log
    assert 'Epoch(train) [1][2/2]' in log  # 8 images / (2 procs x 2)
    assert osp.isfile(tmp_path / 'ddp' / 'epoch_1.pth')
