"""tools/export.py and posmlp_dense.export: ONNX files that are checked in
ONNX Runtime against eager PyTorch, and refused when they do not match."""
from __future__ import annotations

import contextlib
import io
import json
import os
import os.path as osp
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from posmlp_dense import PosMLP
from posmlp_dense.export import (DynamicShapeError, export_onnx,
                                 export_verified, unverified_path,
                                 verify_onnx)
from posmlp_dense.export.coverage import describe_coverage

from conftest import TINY_ARCH, load_tool, randomize_

# Few blocks keep the exported graphs small (export is slow); two at level
# 0, whose 14 x 14 windows are partial at every size used here, so that one
# block's padded tokens feed the next block's mixing.
EXPORT_ARCH = dict(TINY_ARCH, depths=(2, 1, 1, 1))

onnxruntime = pytest.importorskip(
    'onnxruntime', reason='the export extra is not installed: '
    'pip install -e ".[export]"')

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_SEG = osp.join(ROOT, 'configs', 'demo', 'fpn_posmlp_t_demo-shapes.py')


def _tool():
    return load_tool('export')


def _run_tool(argv):
    """(exit status, stdout, stderr) of tools/export.py in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = _tool().main(argv)
    return status, out.getvalue(), err.getvalue()


def _onnx_outputs(path, x):
    session = onnxruntime.InferenceSession(
        str(path), providers=['CPUExecutionProvider'])
    return session.run(None, {session.get_inputs()[0].name: x.numpy()})


def _leftovers(folder):
    """Temporary export files left in ``folder``."""
    return [name for name in os.listdir(folder) if 'partial' in name]


# ----------------------------------------------------------------- toy models
class DriftsWhenExported(nn.Module):
    """Its exported graph computes with other weights than its eager forward:
    a stand-in for an export that silently gets the model wrong."""

    def __init__(self):
        super().__init__()
        self.eager_conv = nn.Conv2d(3, 4, 3, padding=1)
        self.exported_conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        if torch.compiler.is_exporting():
            return self.exported_conv(x)
        return self.eager_conv(x)


class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)

    def forward(self, x):
        y = self.conv(x)
        return y, y.mean(1, keepdim=True)


def test_verified_file_is_renamed_into_place(tmp_path):
    model = TwoOutputs().eval()
    out = tmp_path / 'two.onnx'
    result = export_verified(model, (2, 3, 32, 48), str(out),
                             verify_sizes=[(45, 31), (7, 9)])
    assert result.passed and result.path == str(out) and out.is_file()
    assert _leftovers(tmp_path) == []
    checks = result.report.checks
    # the other sizes run at batch 1: the batch axis is checked too
    assert [c.shape for c in checks] == [(2, 3, 32, 48), (1, 3, 45, 31),
                                         (1, 3, 7, 9)]
    assert [len(c.outputs) for c in checks] == [2, 2, 2]
    assert result.report.input_shape == ['batch', 3, 'height', 'width']
    assert set(result.graph.input_ranges) == {'batch', 'height', 'width'}
    # the file really is dynamic: it runs at a size nobody verified
    x = torch.randn(3, 3, 21, 66)
    got = _onnx_outputs(out, x)
    with torch.no_grad():
        ref = model(x)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-5, atol=1e-5)


def test_file_that_differs_from_eager_is_refused_and_not_kept(tmp_path):
    out = tmp_path / 'drift.onnx'
    result = export_verified(DriftsWhenExported(), (2, 3, 32, 48), str(out))
    assert not result.passed
    assert result.path is None and result.unverified_path is None
    assert not out.exists() and _leftovers(tmp_path) == []
    assert all(not check.passed for check in result.report.checks)
    assert 'NOT verified' in result.report.verdict()
    assert 'beyond tolerance' in result.report.table()


def test_refused_file_leaves_an_existing_file_alone(tmp_path):
    out = tmp_path / 'drift.onnx'
    out.write_bytes(b'the previous, verified file')
    result = export_verified(DriftsWhenExported(), (2, 3, 32, 48), str(out),
                             overwrite=True)
    assert not result.passed
    assert out.read_bytes() == b'the previous, verified file'
    with pytest.raises(FileExistsError, match='overwrite'):
        export_verified(TwoOutputs(), (2, 3, 32, 48), str(out))


def test_keep_unverified_keeps_it_under_a_marked_name(tmp_path):
    out = tmp_path / 'drift.onnx'
    result = export_verified(DriftsWhenExported(), (2, 3, 32, 48), str(out),
                             keep_unverified=True)
    assert not result.passed and not out.exists()
    assert result.unverified_path == unverified_path(str(out)) == str(
        tmp_path / 'drift.UNVERIFIED.onnx')
    assert osp.isfile(result.unverified_path)
    assert _leftovers(tmp_path) == []


def test_file_fixed_to_one_size_fails_verification(tmp_path):
    """What the legacy exporter used to write: a graph for one size only."""
    path = tmp_path / 'static.onnx'
    model = TwoOutputs().eval()
    program = torch.onnx.export(model, (torch.randn(1, 3, 32, 48),),
                                dynamo=True)
    program.save(str(path), external_data=False)
    report = verify_onnx(str(path), model, [(1, 3, 32, 48), (1, 3, 40, 40)],
                         export_shape=(1, 3, 32, 48))
    assert not report.passed
    assert report.checks[0].passed  # right at the size it was made for ...
    assert 'ONNX Runtime failed' in report.checks[1].error  # ... only
    assert any('fixed H and W' in p for p in report.problems)


def test_size_outside_the_graphs_range_is_caught_and_explained(tmp_path):
    """A branch on the size is baked into the graph; torch.export records
    the range it holds for, ONNX Runtime runs it anywhere."""
    class BranchesOnHeight(nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[2] > 40 else x - 1

    result = export_verified(BranchesOnHeight(), (2, 3, 32, 48),
                             str(tmp_path / 'x.onnx'),
                             verify_sizes=[(24, 30), (45, 31)])
    assert not result.passed
    assert result.graph.input_ranges['height'][1] == 40
    assert [check.passed for check in result.report.checks] == [
        True, True, False]
    assert result.report.notes == [
        '1x3x45x31 is outside the sizes torch.export found this graph valid '
        f'for ({result.graph.describe_ranges()}): height 45']


def test_export_onnx_rejects_examples_it_cannot_export_from(tmp_path):
    with pytest.raises(ValueError, match='4-D'):
        export_onnx(TwoOutputs(), torch.randn(3, 32, 48),
                    str(tmp_path / 'x.onnx'))
    with pytest.raises(ValueError, match='at least 2'):
        export_onnx(TwoOutputs(), torch.randn(1, 3, 32, 48),
                    str(tmp_path / 'x.onnx'))
    assert os.listdir(tmp_path) == []


def test_specialized_axis_is_an_export_error_not_a_smaller_graph(tmp_path):
    """torch.onnx.export on its own would quietly fix the width."""
    class FixesWidth(nn.Module):
        def forward(self, x):
            return x.reshape(x.shape[0], x.shape[1], x.shape[2], 48)

    with pytest.raises(DynamicShapeError, match='marked width as dynamic'):
        export_verified(FixesWidth(), (2, 3, 32, 48),
                        str(tmp_path / 'x.onnx'))
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------- the backbone
@pytest.fixture(scope='module')
def backbone_export(tmp_path_factory):
    """The tool, run once on a tiny PosMLP with random saved weights."""
    folder = tmp_path_factory.mktemp('backbone')
    model = randomize_(PosMLP(EXPORT_ARCH, gate='gqpe'), seed=1).eval()
    checkpoint = folder / 'tiny.pth'
    torch.save(model.state_dict(), checkpoint)
    out = folder / 'tiny.onnx'
    status, stdout, stderr = _run_tool([
        '--arch', json.dumps(EXPORT_ARCH), '--gate', 'gqpe', '--checkpoint',
        str(checkpoint), '--shape', '128', '160', '--out', str(out)])
    return SimpleNamespace(status=status, stdout=stdout, stderr=stderr,
                           out=out, model=model, folder=folder)


def test_tool_exports_and_verifies_the_backbone(backbone_export):
    run = backbone_export
    assert run.status == 0, run.stdout + run.stderr
    assert run.out.is_file() and _leftovers(run.folder) == []
    assert 'verified: 3 input sizes' in run.stdout
    # one table row per size and returned level, every one matching
    rows = [line for line in run.stdout.splitlines()
            if line.startswith('| ') and 'level' in line]
    assert len(rows) == 3 * 4 and all(row.endswith('| yes |') for row in rows)
    # the default sizes cover partial windows and maps under one window
    assert '1x3x300x460 | L0-L3 edge |' in run.stdout
    assert '1x3x150x190 | L0,L1 edge, L2,L3 single |' in run.stdout


def test_backbone_file_matches_eager_at_an_unverified_size(backbone_export):
    x = torch.randn(2, 3, 97, 161)  # untiled; level 3 is 4 x 6
    got = _onnx_outputs(backbone_export.out, x)
    with torch.no_grad():
        ref = backbone_export.model(x)
    assert len(got) == len(ref) == 4
    for g, r in zip(got, ref):
        assert g.shape == tuple(r.shape)
        np.testing.assert_allclose(g, r.numpy(), rtol=1e-4, atol=1e-4)


def test_backbone_file_is_refused_for_other_weights(backbone_export):
    other = randomize_(PosMLP(EXPORT_ARCH, gate='gqpe'), seed=2).eval()
    report = verify_onnx(str(backbone_export.out), other,
                         [(1, 3, 128, 160), (1, 3, 150, 190)])
    assert not report.passed
    assert all(out.max_abs_diff > 1e-2 for check in report.checks
               for out in check.outputs)


def test_coverage_names_tiled_partial_and_single_window_levels():
    model = PosMLP(TINY_ARCH)  # windows 14, 14, 14, 7
    assert describe_coverage(model, [(56, 56), (28, 28), (14, 14), (7, 7)]
                             ) == 'L0-L3 tiled'
    assert describe_coverage(model, [(38, 48), (19, 24), (10, 12), (5, 6)]
                             ) == 'L0,L1 edge, L2,L3 single'


# ----------------------------------------------------------- the segmentor
TINY_SEG_CONFIG = '''
_base_ = [{base!r}]
model = dict(
    backbone=dict(arch=dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1),
                            gamma=(4, 8, 16, 32))),
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=16),
    decode_head=dict(in_channels=[16, 16, 16, 16], channels=16))
'''


@pytest.fixture(scope='module')
def tiny_seg_config(tmp_path_factory):
    pytest.importorskip('mmseg')
    config = tmp_path_factory.mktemp('config') / 'fpn_tiny.py'
    config.write_text(TINY_SEG_CONFIG.format(base=DEMO_SEG))
    return config


@pytest.fixture(scope='module')
def segmentor_export(tiny_seg_config, tmp_path_factory):
    """The tool, run once on a tiny Semantic FPN from a training checkpoint
    laid out as mmengine's Runner saves it (message hub included)."""
    from mmengine.logging import MessageHub
    from posmlp_dense.export import build_segmentor
    folder = tmp_path_factory.mktemp('segmentor')
    segmentor = randomize_(build_segmentor(str(tiny_seg_config)),
                           seed=3).eval()
    hub = MessageHub.get_instance('export_tool_test')
    hub.update_scalar('train/loss', 0.5)
    checkpoint = folder / 'iter_1.pth'
    torch.save({'meta': {'iter': 1}, 'state_dict': segmentor.state_dict(),
                'message_hub': hub.state_dict()}, checkpoint)
    out = folder / 'fpn_tiny.onnx'
    status, stdout, stderr = _run_tool([
        '--config', str(tiny_seg_config), '--checkpoint', str(checkpoint),
        '--shape', '192', '256', '--out', str(out)])
    return SimpleNamespace(status=status, stdout=stdout, stderr=stderr,
                           out=out, config=tiny_seg_config,
                           checkpoint=checkpoint)


def test_tool_exports_and_verifies_the_segmentor(segmentor_export):
    run = segmentor_export
    assert run.status == 0, run.stdout + run.stderr
    assert 'verified: 3 input sizes' in run.stdout
    rows = [line for line in run.stdout.splitlines()
            if line.startswith('| ') and 'logits' in line]
    assert len(rows) == 3 and all(row.endswith('| yes |') for row in rows)
    assert 'mean [123.675, 116.28, 103.53]' in run.stdout
    assert '6 Upsample modules computed with symbolic sizes' in \
        run.stdout  # FPN head: 3 + 2 + 1 for its scale heads


def test_segmentor_file_gives_mmsegs_own_logits(segmentor_export):
    """Against the segmentor as mmseg builds it (its own Upsample modules),
    loaded from the checkpoint, at a size nobody verified."""
    from posmlp_dense.export import build_segmentor
    segmentor = build_segmentor(str(segmentor_export.config),
                                str(segmentor_export.checkpoint))
    x = torch.randn(1, 3, 97, 161)
    (got,) = _onnx_outputs(segmentor_export.out, x)
    with torch.no_grad():
        ref = segmentor(x, mode='tensor')
    assert got.shape == tuple(ref.shape) == (1, 4, 25, 41)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('mode,align_corners', [
    ('bilinear', False), ('bilinear', True), ('nearest', None)])
def test_symbolic_upsample_computes_what_mmsegs_upsample_computes(
        mode, align_corners):
    mmseg_utils = pytest.importorskip('mmseg.models.utils')
    from posmlp_dense.export.mmseg_upsample import make_upsampling_symbolic
    model = nn.Sequential(
        nn.Identity(), mmseg_utils.Upsample(scale_factor=2, mode=mode,
                                            align_corners=align_corners),
        mmseg_utils.Upsample(scale_factor=1.5, mode=mode,
                             align_corners=align_corners))
    x = torch.randn(2, 3, 7, 12)
    with torch.no_grad():
        before = model(x)
        assert make_upsampling_symbolic(model) == 1  # not the 1.5 factor
        after = model(x)
    assert type(model[2]) is mmseg_utils.Upsample
    assert before.shape == (2, 3, 21, 36) and torch.equal(before, after)


def test_segmentor_checkpoint_of_another_model_is_refused(tiny_seg_config,
                                                          tmp_path):
    wrong = tmp_path / 'wrong.pth'
    torch.save({'state_dict': PosMLP(TINY_ARCH).state_dict()}, wrong)
    out = tmp_path / 'x.onnx'
    status, _, stderr = _run_tool(['--config', str(tiny_seg_config),
                                   '--checkpoint', str(wrong), '--out',
                                   str(out)])
    assert status == 2 and 'does not fit the segmentor' in stderr
    assert not out.exists()


def test_config_of_another_framework_is_refused(tmp_path):
    config = tmp_path / 'classifier.py'
    config.write_text("default_scope = 'mmpretrain'\nmodel = dict()\n")
    status, _, stderr = _run_tool(['--config', str(config), '--out',
                                   str(tmp_path / 'x.onnx')])
    assert status == 2 and 'neither an mmseg nor an mmdet config' in stderr
    assert os.listdir(tmp_path) == ['classifier.py']


TINY_UPERNET_CONFIG = '''
_base_ = [{base!r}]
model = dict(
    backbone=dict(arch=dict(_delete_=True, embed_dims=(16, 32, 64, 128),
                            depths=(1, 1, 1, 1), mlp_ratio=(4, 4, 4, 2),
                            gamma=(4, 8, 16, 32), window_size=(14, 14, 14, 7)),
                  init_cfg=None),
    decode_head=dict(in_channels=[16, 32, 64, 128], channels=16,
                     num_classes=5),
    auxiliary_head=dict(in_channels=64, channels=16, num_classes=5))
'''


def test_upernet_exports_with_its_pyramid_pooling_right_at_every_size(
        tmp_path):
    """UperNet's PPM pools to 1, 2, 3 and 6 bins: as written, the ONNX
    file would hold its bins for the export size only."""
    pytest.importorskip('mmseg')
    from posmlp_dense.export import SegmentorLogits, build_segmentor
    config = tmp_path / 'upernet_tiny.py'
    config.write_text(TINY_UPERNET_CONFIG.format(base=osp.join(
        ROOT, 'configs', 'upernet_posmlp_t_8xb2-160k_ade20k-512x512.py')))
    model = SegmentorLogits(randomize_(build_segmentor(str(config)),
                                       seed=4))
    assert model.replaced == {'Upsample': 0, 'AdaptiveAvgPool2d': 4}
    result = export_verified(model, (2, 3, 192, 256),
                             str(tmp_path / 'upernet.onnx'),
                             output_names=['logits'])
    assert result.passed, result.report.table()
    # against mmseg's own modules (nn.AdaptiveAvgPool2d), same weights
    reference = build_segmentor(str(config))
    reference.load_state_dict(model.segmentor.state_dict())
    x = torch.randn(1, 3, 97, 161)
    (got,) = _onnx_outputs(result.path, x)
    with torch.no_grad():
        ref = reference(x, mode='tensor')
    assert got.shape == tuple(ref.shape)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('bins', [1, 2, 3, 6, (2, 5)])
def test_symbolic_adaptive_pooling_matches_pytorchs(bins):
    from posmlp_dense.export import SymbolicAdaptiveAvgPool2d
    for size in ((16, 16), (10, 15), (5, 6), (1, 1), (7, 97)):
        x = torch.randn(2, 3, *size)
        torch.testing.assert_close(SymbolicAdaptiveAvgPool2d(bins)(x),
                                   nn.AdaptiveAvgPool2d(bins)(x),
                                   rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------ command line
def test_tool_refuses_to_replace_a_file_without_overwrite(tmp_path):
    out = tmp_path / 'exists.onnx'
    out.write_bytes(b'keep me')
    status, _, stderr = _run_tool(['--arch', json.dumps(TINY_ARCH), '--out',
                                   str(out)])
    assert status == 2 and '--overwrite' in stderr
    assert out.read_bytes() == b'keep me'


@pytest.mark.parametrize('argv', [
    ['--arch', 't', '--out', 'x.onnx', '--verify-sizes', '300'],
    ['--arch', 't', '--out', 'x.onnx', '--verify-sizes', '0x8'],
    ['--arch', '{"embed_dims": [1, 2', '--out', 'x.onnx'],
    ['--arch', 't', '--config', 'c.py', '--out', 'x.onnx'],
    ['--config', 'c.py', '--gate', 'lrpe', '--out', 'x.onnx'],
    ['--arch', 't', '--batch', '1', '--out', 'x.onnx'],
    ['--arch', 't', '--image', 'photo.jpg', '--out', 'x.onnx'],
    ['--arch', 't'],
])
def test_tool_rejects_bad_arguments(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _tool().parse_args(argv)
    assert exit_info.value.code == 2
    assert 'error' in capsys.readouterr().err


# Makes onnxruntime look uninstalled: with None in sys.modules, importing
# it fails and importlib.util.find_spec reports no such module.
HIDE_ONNXRUNTIME = '''
import runpy, sys
sys.modules['onnxruntime'] = None
sys.argv = ['tools/export.py'] + sys.argv[1:]
runpy.run_path('tools/export.py', run_name='__main__')
'''


def test_missing_export_dependency_is_named(tmp_path):
    out = tmp_path / 'x.onnx'
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run(
        [sys.executable, '-c', HIDE_ONNXRUNTIME, '--arch', 't', '--out',
         str(out)], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert 'onnxruntime, which is not installed' in res.stderr
    assert 'pip install -e ".[export]"' in res.stderr
    assert not out.exists()
