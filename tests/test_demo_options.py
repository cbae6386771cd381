"""tools/demo.py: --epochs / --iters / --pretrained / --scratch, its own
pretraining's reuse, and empty predictions."""
from __future__ import annotations

import argparse
import copy
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config, DictAction

from conftest import load_tool

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET = 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py'
SEG = 'configs/demo/fpn_posmlp_t_demo-shapes.py'

demo = load_tool('demo')


_PARSED = {}


def _parsed(config: str) -> Config:
    """A fresh copy of a demo config (parsed once: its mmdet/mmseg bases
    take seconds to resolve)."""
    if config not in _PARSED:
        _PARSED[config] = Config.fromfile(osp.join(ROOT, config))
    return copy.deepcopy(_PARSED[config])


def _merged(config: str, options: list) -> Config:
    """The config as train.py sees it after --cfg-options OPTIONS."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    parsed = parser.parse_args(['--cfg-options'] + options).cfg_options
    cfg = _parsed(config)
    cfg.merge_from_dict(parsed)
    return cfg


def test_epochs_move_the_whole_detection_schedule():
    cfg = _merged(DET, demo.schedule_options(DET, 3))
    assert cfg.train_cfg.max_epochs == 3
    assert cfg.train_cfg.val_interval == 3
    assert cfg.default_hooks.checkpoint.interval == 3
    warmup, cosine = cfg.param_scheduler
    assert cosine.type == 'CosineAnnealingLR' and cosine.end == 3
    # the warmup counts iterations, not epochs: left as it is
    assert warmup.by_epoch is False and warmup.end == 50


def test_iters_move_the_segmentation_schedule_and_its_warmup():
    original = _parsed(SEG)
    assert original.param_scheduler[0].end == 20  # the warmup below moves
    cfg = _merged(SEG, demo.schedule_options(SEG, 10))
    assert cfg.train_cfg.max_iters == 10
    assert cfg.train_cfg.val_interval == 10
    assert cfg.default_hooks.checkpoint.interval == 10
    warmup, poly = cfg.param_scheduler
    assert warmup.end == 2 and poly.begin == 2 and poly.end == 10
    longer = _merged(SEG, demo.schedule_options(SEG, 900))
    assert longer.param_scheduler[0].end == 20
    assert longer.param_scheduler[1].begin == 20
    assert longer.param_scheduler[1].end == 900


def test_pretrained_option_replaces_the_demo_backbones_none_init_cfg(
        tmp_path):
    ckpt = tmp_path / 'pre.pth'
    cfg = _merged(DET, demo.pretrained_options(str(ckpt)))
    assert cfg.model.backbone.init_cfg == dict(type='Pretrained',
                                               checkpoint=str(ckpt))


@pytest.mark.parametrize('argv, message', [
    (['--task', 'det', '--iters', '5'], '--iters'),
    (['--task', 'seg', '--epochs', '5'], '--epochs'),
    (['--epochs', '0'], 'must be positive'),
    (['--pretrained', '/nonexistent/ckpt.pth'], 'not found'),
])
def test_options_that_do_not_apply_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo.parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_all_tasks_take_both_options():
    args = demo.parse_args(['--task', 'all', '--epochs', '2', '--iters',
                            '7'])
    assert (args.epochs, args.iters) == (2, 7)


def test_empty_metrics_are_an_map_of_zero(tmp_path):
    path = tmp_path / 'metrics.json'
    path.write_text('{}\n')
    assert demo.read_metric(str(path), 'coco/bbox_mAP') == 0.0
    path.write_text(json.dumps({'coco/bbox_mAP_50': 0.5}))
    with pytest.raises(KeyError, match='coco/bbox_mAP'):
        demo.read_metric(str(path), 'coco/bbox_mAP')  # a real mix-up


def test_one_epoch_demo_with_no_predictions_reports_zero(tmp_path):
    """The whole demo on a short schedule where the model predicts
    nothing (score threshold above any sigmoid): it used to stop with
    KeyError: 'coco/bbox_mAP'."""
    work = tmp_path / 'demo'
    small = ['train_dataloader.dataset.indices=8',
             'train_dataloader.batch_size=4',
             'val_dataloader.dataset.indices=4',
             'test_dataloader.dataset.indices=4',
             'model.test_cfg.score_thr=1.01']
    res = subprocess.run(
        [sys.executable, 'tools/demo.py', '--scratch', '--epochs', '1',
         '--work-dir', str(work), '--cfg-options'] + small,
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env=dict(os.environ, PYTHONPATH=ROOT))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert 'untrained 0.000 -> trained 0.000' in out
    assert 'no predictions' in out
    assert osp.isfile(work / 'det' / 'train' / 'epoch_1.pth')
    assert not osp.exists(work / 'det' / 'train' / 'epoch_2.pth')
    assert json.loads((work / 'det' / 'metrics.json').read_text()) == {}


def test_pretraining_runs_once_then_is_reused_until_its_recipe_changes(
        tmp_path, monkeypatch, capsys):
    """tools/demo.py's own pretraining, with tools/pretrain.py replaced by
    a stand-in that writes a checkpoint: the first call runs it, the second
    reuses it, and after the recipe changed in the code it runs again."""
    from posmlp_dense.pretraining import recipe
    calls = []

    def fake_run(args):
        calls.append(args)
        output = args[args.index('--output') + 1]
        os.makedirs(output, exist_ok=True)
        with open(osp.join(output, 'last.pth'), 'wb') as f:
            f.write(b'weights')

    monkeypatch.setattr(demo, 'run', fake_run)
    monkeypatch.chdir(ROOT)  # the config path in the command is relative
    data, work = str(tmp_path / 'data'), str(tmp_path / 'work')
    ckpt = demo.demo_pretraining(work, data)
    assert ckpt == osp.join(work, 'pretrain', 'last.pth')
    assert len(calls) == 1 and calls[0][0].endswith('pretrain.py')
    assert 'no checkpoint at' in capsys.readouterr().out
    assert demo.demo_pretraining(work, data) == ckpt
    assert len(calls) == 1
    out = capsys.readouterr().out
    assert 'reusing it' in out
    assert 'python tools/pretrain.py --data ' + osp.join(data, 'demo_cls') \
        in out
    monkeypatch.setattr(recipe, 'SHAPES_DEMO',
                        recipe.SHAPES_DEMO.replace(epochs=41))
    demo.demo_pretraining(work, data)
    assert len(calls) == 2
    assert 'recipe differ' in capsys.readouterr().out


def test_scratch_and_pretrained_exclude_each_other(tmp_path, capsys):
    ckpt = tmp_path / 'pre.pth'
    ckpt.write_bytes(b'')
    with pytest.raises(SystemExit):
        demo.parse_args(['--scratch', '--pretrained', str(ckpt)])
    assert 'not allowed with' in capsys.readouterr().err


def test_phase_clock_times_each_phase_until_the_next(monkeypatch, capsys):
    now = iter([0.0, 2.0, 2.0, 7.5])
    monkeypatch.setattr(demo.time, 'perf_counter', lambda: next(now))
    clock = demo.PhaseClock()
    clock.start('datasets')
    clock.start('train')
    clock.stop()
    clock.stop()  # nothing open: nothing added
    assert clock.phases == [('datasets', 2.0), ('train', 5.5)]
    assert clock.total() == 7.5
    assert '=== datasets' in capsys.readouterr().out
    assert clock.report().splitlines() == ['  datasets       2 s',
                                           '  train          6 s']


def test_the_printed_nms_is_the_merged_configs():
    """The demo says which NMS made the boxes it scores, after the
    user's --cfg-options."""
    shipped = demo.merged_config(DET, [])
    per_class = demo.merged_config(
        DET, ['model.test_cfg.nms.class_agnostic=False'])
    agnostic = demo.merged_config(
        DET, ['model.test_cfg.nms.class_agnostic=True'])
    assert demo.nms_note(agnostic).startswith('class-agnostic')
    assert demo.nms_note(per_class).startswith('per-class')
    assert demo.nms_note(shipped) == demo.nms_note(agnostic)
