"""tools/pretrain.py: timm-based pretraining, resuming, DDP on CPU, and
checkpoints that the backbone loaders read as they are."""
from __future__ import annotations

import json
import os
import os.path as osp
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from posmlp_dense import PosMLP, load_pretrained, read_checkpoint
from posmlp_dense.data.shape_classes import (CLASSES,
                                             make_classification_set)
from posmlp_dense.pretraining import POSMLP_S, POSMLP_T
from posmlp_dense.pretraining.cli import build_parser, main, \
    recipe_from_args
from posmlp_dense.pretraining.model_factory import arch_from_config

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_DET = osp.join(ROOT, 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py')
# a short CPU run: small images, the demo backbone, no RandAugment
FAST = ['--arch-from-config', DEMO_DET, '--img-size', '32', '--batch-size',
        '4', '--warmup-epochs', '0', '--cooldown-epochs', '0', '--aa',
        'none', '--workers', '0', '--log-interval', '1', '--lr', '1e-3',
        '--model-ema-warmup']


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp('cls')
    make_classification_set(str(root), num_train=12, num_val=6,
                            image_size=40, seed=1)
    return str(root)


@pytest.fixture(scope='module')
def one_epoch(data, tmp_path_factory):
    """The output folder of a finished one-epoch run (copy it to change
    it)."""
    out = str(tmp_path_factory.mktemp('one_epoch') / 'run')
    result = main(['--data', data, '--output', out, '--epochs', '1']
                  + FAST)
    assert result['last']['epoch'] == 1
    return out


def test_classification_set_is_a_balanced_deterministic_imagefolder(
        tmp_path):
    a = make_classification_set(str(tmp_path / 'a'), num_train=6,
                                num_val=3, image_size=48, seed=4)
    b = make_classification_set(str(tmp_path / 'b'), num_train=6,
                                num_val=3, image_size=48, seed=4)
    assert a['train_per_class'] == [2, 2, 2]
    assert a['val_per_class'] == [1, 1, 1]
    for split, n in (('train', 6), ('val', 3)):
        names = sorted(os.listdir(tmp_path / 'a' / split))
        assert names == sorted(CLASSES)
        files = [osp.join(split, c, f) for c in names
                 for f in sorted(os.listdir(tmp_path / 'a' / split / c))]
        assert len(files) == n
        for rel in files:  # byte-identical from the same seed
            assert open(tmp_path / 'a' / rel, 'rb').read() == \
                open(tmp_path / 'b' / rel, 'rb').read()
    again = make_classification_set(str(tmp_path / 'a'), num_train=6,
                                    num_val=3, image_size=48, seed=4)
    assert again['reused'] and not a['reused']
    other = make_classification_set(str(tmp_path / 'c'), num_train=6,
                                    num_val=3, image_size=48, seed=5)
    first = osp.join('train', 'circle', 'demo_train_00000.jpg')
    assert open(tmp_path / 'c' / first, 'rb').read() != \
        open(tmp_path / 'a' / first, 'rb').read()


def test_published_recipes_and_overrides():
    assert (POSMLP_T.lr, POSMLP_T.batch_size, POSMLP_T.cooldown_epochs) == \
        (2e-3, 128, 10)
    assert (POSMLP_S.lr, POSMLP_S.batch_size, POSMLP_S.cooldown_epochs) == \
        (1e-3, 60, 0)
    args = build_parser().parse_args(
        ['--data', 'x', '--model', 'posmlp_s', '--epochs', '3', '--aa',
         'none', '--scale', '0.5', '1', '--clip-grad', '0',
         '--no-model-ema'])
    recipe = recipe_from_args(args)
    assert recipe.epochs == 3 and recipe.auto_augment is None
    assert recipe.scale == (0.5, 1.0) and recipe.clip_grad is None
    assert recipe.model_ema is False
    assert recipe.replace(epochs=300) == POSMLP_S.replace(
        auto_augment=None, scale=(0.5, 1.0), clip_grad=None,
        model_ema=False)  # everything else stays published


def test_train_resume_and_load_into_backbone_and_detector(data, one_epoch,
                                                          tmp_path):
    out = str(tmp_path / 'run')
    shutil.copytree(one_epoch, out)
    ckpt = read_checkpoint(osp.join(out, 'last.pth'))  # weights_only
    assert ckpt['epoch'] == 0 and 'optimizer' in ckpt
    assert set(ckpt['state_dict']) == set(ckpt['state_dict_ema'])
    assert ckpt['classes'] == list(CLASSES)

    second = main(['--data', data, '--output', out, '--epochs', '2',
                   '--resume'] + FAST)
    assert second['last']['epoch'] == 2
    log = open(osp.join(out, 'log.txt')).read()
    assert 'resumed from' in log and 'epoch 2/2 [3/3]' in log
    assert 'epoch 1/2 [' not in log.split('resumed from')[1]  # not redone
    assert 'img/s' in log and 'eta' in log
    ckpt = read_checkpoint(osp.join(out, 'last.pth'))
    assert ckpt['epoch'] == 1
    assert ckpt['optimizer']['state']  # AdamW moments came along
    ema = ckpt['state_dict_ema']

    # the backbone of the demo config reads it as it is: every weight of
    # the checkpoint is used; only the dense-prediction output norms
    # (norm1..3, not in any classifier) keep their initialization
    kwargs = arch_from_config(DEMO_DET)
    backbone = PosMLP(out_indices=(1, 2, 3), **kwargs)
    report = load_pretrained(backbone, osp.join(out, 'last.pth'))
    assert report.entry == 'state_dict_ema'
    assert report.unexpected == [] and report.resized == []
    assert sorted(report.missing) == sorted(
        k for k in backbone.state_dict() if k.startswith('norm'))
    assert set(report.skipped_classifier) == {'head.weight', 'head.bias',
                                              'norm.weight', 'norm.bias'}
    for key, value in backbone.state_dict().items():
        if key in ema:
            assert torch.equal(value, ema[key]), key

    # and so does the demo detector through init_cfg
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.utils import import_modules_from_strings
    register_all_modules()
    cfg = Config.fromfile(DEMO_DET)
    import_modules_from_strings(**cfg.custom_imports)  # PosMLP
    cfg.model.backbone.init_cfg = dict(type='Pretrained',
                                       checkpoint=osp.join(out, 'last.pth'))
    detector = MODELS.build(cfg.model)
    detector.init_weights()
    det_report = detector.backbone.load_report
    assert det_report.loaded == report.loaded
    assert det_report.missing == report.missing
    for key, value in detector.backbone.state_dict().items():
        if key in ema:
            assert torch.equal(value, ema[key]), key


def test_resume_refuses_another_model(data, one_epoch, tmp_path):
    out = str(tmp_path / 'run')
    shutil.copytree(one_epoch, out)
    other = FAST[2:]  # drop --arch-from-config: plain posmlp_t
    arch = json.dumps(dict(embed_dims=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                           mlp_ratio=[4, 4, 4, 2], gamma=[4, 8, 16, 32],
                           window_size=[7, 7, 7, 7]))
    with pytest.raises(ValueError, match='this run builds'):
        main(['--data', data, '--output', out, '--epochs', '2', '--resume',
              '--arch', arch] + other)


def test_bad_data_is_named(tmp_path):
    os.makedirs(tmp_path / 'train' / 'a')
    with pytest.raises(FileNotFoundError, match='val'):
        main(['--data', str(tmp_path), '--output', str(tmp_path / 'o')]
             + FAST)


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_two_process_torchrun_on_cpu(data, tmp_path):
    out = tmp_path / 'ddp'
    res = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node',
         '2', '--master_port', str(_free_port()), 'tools/pretrain.py',
         '--data', data, '--output', str(out), '--epochs', '1',
         '--batch-size', '2'] + FAST[:4] + FAST[6:],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS='1'))
    log = res.stdout + res.stderr
    assert res.returncode == 0, log[-4000:]
    assert '2 process(es) on cpu' in log
    assert '(4 in all)' in log and '3 steps per epoch' in log  # 12 / (2x2)
    ckpt = read_checkpoint(str(out / 'last.pth'))
    assert ckpt['epoch'] == 0 and 'state_dict_ema' in ckpt
    assert not any(k.startswith('module.') for k in ckpt['state_dict'])
