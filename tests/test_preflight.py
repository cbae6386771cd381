"""The preflight of tools/train.py and tools/test.py: every missing file of a
config in one list, each with its fix, exit status 2, no traceback."""
from __future__ import annotations

import copy
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config

from posmlp_dense.openmmlab.runtime import preflight

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
HEADLINE = 'configs/retinanet_posmlp_s_fpn.py'
DEMO_DET = 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py'
ADE = 'configs/fpn_posmlp_t_4xb4-40k_ade20k-512x512.py'


def _tool(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT))


_PARSED = {}


def _config(path, **changes):
    """A fresh copy of a shipped config (parsed once: mmdet/mmseg bases
    take seconds to resolve), with ``changes`` merged as --cfg-options."""
    if path not in _PARSED:
        _PARSED[path] = Config.fromfile(osp.join(ROOT, path))
    cfg = copy.deepcopy(_PARSED[path])
    cfg.merge_from_dict(changes)
    return cfg


def _touch(path):
    os.makedirs(osp.dirname(path), exist_ok=True)
    open(path, 'w').close()


def test_headline_config_lists_everything_missing_and_exits_2(tmp_path):
    coco = tmp_path / 'coco'
    ckpt = tmp_path / 'posmlp_s_imagenet.pth'
    start = tmp_path / 'start.pth'
    res = _tool('tools/train.py', HEADLINE, '--work-dir',
                str(tmp_path / 'work'), '--cfg-options',
                f'train_dataloader.dataset.data_root={coco}/',
                f'val_dataloader.dataset.data_root={coco}/',
                f'val_evaluator.ann_file={coco}/annotations/val.json',
                f'model.backbone.init_cfg.checkpoint={ckpt}',
                f'load_from={start}')
    assert res.returncode == preflight.EXIT_STATUS, res.stderr[-3000:]
    assert 'Traceback' not in res.stderr
    err = res.stderr
    # the first screen opens with the user's problem, not with warnings of
    # third-party packages (posmlp_dense/known_warnings.py)
    assert err.startswith('preflight: '), err[:1000]
    # every missing item, in one run
    assert err.count(f'data root: {coco}/') == 2  # train and val sets
    # the evaluator's file lies under that root: no entry of its own, but
    # the fix names it (COCO metrics do not join data_root)
    assert 'val_evaluator (CocoMetric)' not in err
    assert 'val_evaluator.ann_file=/path/to/it/annotations/val.json' in err
    assert f'model.backbone.init_cfg.checkpoint: PosMLP-S ImageNet ' \
        f'weights: {ckpt}' in err
    assert f'load_from (weights to start from): {start}' in err
    assert '4 files or folders missing' in err
    # ... and the fixes
    assert 'annotations/instances_train2017.json' in err  # COCO layout
    assert 'train2017/' in err and 'cocodataset.org' in err
    assert 'never released' in err
    assert 'tools/pretrain.py --model posmlp_s' in err
    assert '--cfg-options model.backbone.init_cfg=None' in err
    assert '--cfg-options load_from=None' in err
    assert not osp.exists(tmp_path / 'work')  # nothing was run


def test_each_missing_file_under_an_existing_root_is_listed(tmp_path):
    root = tmp_path / 'coco'
    _touch(str(root / 'annotations' / 'instances_train2017.json'))
    os.makedirs(root / 'val2017')
    cfg = _config(HEADLINE, **{
        'train_dataloader.dataset.data_root': f'{root}/',
        'val_dataloader.dataset.data_root': f'{root}/',
        'val_evaluator.ann_file':
            f'{root}/annotations/instances_val2017.json',
        'model.backbone.init_cfg': None})
    missing = preflight.find_missing(cfg, 'train')
    assert sorted(m.path for m in missing) == sorted([
        f'{root}/train2017/', f'{root}/annotations/instances_val2017.json'])
    whats = ' '.join(m.what for m in missing)
    assert 'data_prefix.img' in whats and 'annotation file' in whats


def test_a_complete_config_passes(tmp_path):
    root = tmp_path / 'coco'
    for name in ('instances_train2017.json', 'instances_val2017.json'):
        _touch(str(root / 'annotations' / name))
    for name in ('train2017', 'val2017'):
        os.makedirs(root / name)
    weights = tmp_path / 'w.pth'
    _touch(str(weights))
    cfg = _config(HEADLINE, **{
        'train_dataloader.dataset.data_root': f'{root}/',
        'val_dataloader.dataset.data_root': f'{root}/',
        'val_evaluator.ann_file':
            f'{root}/annotations/instances_val2017.json',
        'model.backbone.init_cfg.checkpoint': str(weights)})
    assert preflight.find_missing(cfg, 'train') == []


def test_absolute_prefixes_ignore_data_root_as_mmengine_does(tmp_path):
    images = tmp_path / 'elsewhere' / 'images'
    os.makedirs(images)
    ann = tmp_path / 'ann.json'
    _touch(str(ann))
    dataset = dict(type='CocoDataset', data_root=str(tmp_path / 'nowhere'),
                   ann_file=str(ann), data_prefix=dict(img=str(images)))
    root, paths = preflight.dataset_paths(dataset)
    assert paths == [('annotation file', str(ann)),
                     ('folder data_prefix.img', str(images))]
    # relative ones are joined to a non-empty data_root, as BaseDataset does
    _, paths = preflight.dataset_paths(dict(
        data_root='data/x', ann_file='a.json', data_prefix=dict(img='i/')))
    assert paths == [('annotation file', 'data/x/a.json'),
                     ('folder data_prefix.img', 'data/x/i/')]
    _, paths = preflight.dataset_paths(dict(
        data_root='', ann_file='a.json', data_prefix=dict(img='i/')))
    assert paths == [('annotation file', 'a.json'),
                     ('folder data_prefix.img', 'i/')]


def test_ade20k_layout_and_dataset_wrappers(tmp_path):
    ade = tmp_path / 'ade' / 'ADEChallengeData2016'
    os.makedirs(ade / 'images' / 'training')
    os.makedirs(ade / 'annotations' / 'training')
    os.makedirs(ade / 'images' / 'validation')  # its annotations are absent
    cfg = _config(ADE, **{'train_dataloader.dataset.data_root': str(ade),
                          'val_dataloader.dataset.data_root': str(ade),
                          'model.backbone.init_cfg': None})
    missing = preflight.find_missing(cfg, 'train')
    assert [m.path for m in missing] == [
        str(ade / 'annotations' / 'validation')]
    assert 'data_prefix.seg_map_path' in missing[0].what
    assert 'ADEChallengeData2016.zip' in missing[0].fix
    # the same sets behind RepeatDataset and ConcatDataset
    inner = cfg.train_dataloader.dataset.to_dict()
    cfg.train_dataloader.dataset = dict(
        type='ConcatDataset', datasets=[
            dict(type='RepeatDataset', times=2, dataset=inner),
            dict(inner, data_root=str(tmp_path / 'gone'))])
    missing = preflight.find_missing(cfg, 'train')
    assert {m.what.split(' ')[0] for m in missing} == {
        'train_dataloader.dataset.datasets.1', 'val_dataloader.dataset'}


def test_checkpoint_fixes_name_the_way_to_get_the_weights(tmp_path):
    ckpt = str(tmp_path / 'posmlp_t.pth')
    cfg = _config(DEMO_DET, **{'model.backbone.arch': 't'})
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=ckpt)
    [item] = preflight.check_checkpoints(cfg)
    assert item.path == ckpt and 'PosMLP-T' in item.what
    assert 'drive.google.com' in item.fix
    assert 'tools/convert_checkpoint.py' in item.fix
    assert 'model.backbone.init_cfg=None' in item.fix
    # the demo's small custom arch: pretrain that arch
    cfg = _config(DEMO_DET)
    cfg.model.backbone.init_cfg = dict(type='Pretrained', checkpoint=ckpt)
    [item] = preflight.check_checkpoints(cfg)
    assert 'custom PosMLP' in item.what
    assert '--arch-from-config' in item.fix
    # URLs are fetched by mmengine, not checked here
    cfg.model.backbone.init_cfg.checkpoint = 'https://example.com/w.pth'
    assert preflight.check_checkpoints(cfg) == []


def test_resume_and_test_checkpoints(tmp_path):
    cfg = _config(DEMO_DET)
    gone = str(tmp_path / 'epoch_3.pth')
    [item] = preflight.check_run_checkpoints(cfg, 'train', gone, None)
    assert item.path == gone and '--resume' in item.what
    assert preflight.check_run_checkpoints(cfg, 'train', 'auto', None) == []
    cfg.load_from, cfg.resume = gone, True
    [item] = preflight.check_run_checkpoints(cfg, 'train', None, None)
    assert 'resume=True' in item.what
    [item] = preflight.check_run_checkpoints(cfg, 'test', None, gone)
    assert item.what == 'checkpoint to evaluate'


def test_test_mode_checks_the_test_set_not_the_training_weights(tmp_path):
    cfg = _config(HEADLINE, **{
        'test_dataloader.dataset.data_root': f'{tmp_path}/coco/',
        'test_evaluator.ann_file': f'{tmp_path}/elsewhere/val.json'})
    missing = preflight.find_missing(cfg, 'test',
                                     checkpoint=str(tmp_path / 'x.pth'))
    assert [m.path for m in missing] == [
        f'{tmp_path}/coco/', f'{tmp_path}/elsewhere/val.json',
        str(tmp_path / 'x.pth')]  # no ImageNet weights: test() loads none


def test_test_tool_runs_the_preflight(tmp_path):
    res = _tool('tools/test.py', DEMO_DET, str(tmp_path / 'none.pth'),
                '--cfg-options',
                f'test_dataloader.dataset.data_root={tmp_path}/d/')
    assert res.returncode == 2 and 'Traceback' not in res.stderr
    assert 'checkpoint to evaluate' in res.stderr
    assert f'data root: {tmp_path}/d/' in res.stderr


def test_skip_preflight_goes_on_to_the_real_error(tmp_path):
    res = _tool('tools/train.py', DEMO_DET, '--skip-preflight',
                '--work-dir', str(tmp_path / 'work'), '--cfg-options',
                f'train_dataloader.dataset.data_root={tmp_path}/d/')
    assert res.returncode not in (0, 2)
    assert 'Nothing was run' not in res.stderr
    # mmdet's own error on the first missing file, with its traceback
    assert 'Traceback' in res.stderr and 'FileNotFoundError' in res.stderr


@pytest.mark.parametrize('mode', ['val', ''])
def test_unknown_mode_is_refused(mode):
    with pytest.raises(ValueError, match='mode'):
        preflight.find_missing(_config(DEMO_DET), mode)
