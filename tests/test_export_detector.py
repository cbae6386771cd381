"""Whole detectors to ONNX (tools/export.py --config with an mmdet config):
one graph from the image tensor to boxes (and masks), checked box for box
against mmdet's own predict, and clear refusals for what it cannot hold."""
from __future__ import annotations

import contextlib
import io
import os
import os.path as osp
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import load_tool, randomize_
from detection_weights import make_retinanet_detect_, make_two_stage_detect_

onnxruntime = pytest.importorskip(
    'onnxruntime', reason='the export extra is not installed: '
    'pip install -e ".[export]"')
pytest.importorskip('mmdet')
pytest.importorskip('mmcv.ops', reason="mmdet's predict needs mmcv's ops")

from posmlp_dense.export.detection import (  # noqa: E402
    UnsupportedDetectorError, build_detector, detector_end2end,
    verify_detector_onnx)
from posmlp_dense.export.detection.verification import (  # noqa: E402
    MASK_PIXELS, compare_image, mask_agreement, tensor_samples)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
RETINANET_T = osp.join(ROOT, 'configs', 'retinanet_posmlp_t_fpn_1x_coco.py')
MASK_RCNN_T = osp.join(ROOT, 'configs', 'mask-rcnn_posmlp_t_fpn_1x_coco.py')

# A small PosMLP with one block per level; small necks and heads, 4 classes
TINY_BACKBONE = '''dict(arch=dict(_delete_=True, embed_dims=(16, 32, 64, 128),
                   depths=(1, 1, 1, 1), mlp_ratio=(4, 4, 4, 2),
                   gamma=(4, 8, 16, 32), window_size=(14, 14, 14, 7)),
         init_cfg=None)'''
TINY_RETINANET = '''
_base_ = [{base!r}]
model = dict(
    backbone={backbone},
    neck=dict(in_channels=[32, 64, 128], out_channels=32),
    bbox_head=dict(num_classes=4, in_channels=32, feat_channels=32,
                   stacked_convs=1))
'''
TINY_MASK_RCNN = '''
_base_ = [{base!r}]
model = dict(
    backbone={backbone},
    neck=dict(in_channels=[16, 32, 64, 128], out_channels=32),
    rpn_head=dict(in_channels=32, feat_channels=32),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=32),
        bbox_head=dict(in_channels=32, fc_out_channels=64, num_classes=4),
        mask_roi_extractor=dict(out_channels=32),
        mask_head=dict(num_convs=1, in_channels=32, conv_out_channels=32,
                       num_classes=4)),
    test_cfg=dict(rpn=dict(max_per_img=200), rcnn=dict(max_per_img=40)))
'''
EXPORT_SIZE = ('128', '160')
# untiled sizes the export never saw: a level-3 map under one window,
# and one whose coarsest FPN maps are a single pixel high
NEW_SIZES = ((1, 3, 111, 175), (3, 3, 200, 96), (1, 3, 45, 70))


def _tool():
    return load_tool('export')


def _run_tool(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = _tool().main(argv)
    return status, out.getvalue(), err.getvalue()


def _photo():
    """A real photograph shipped with matplotlib, if it is installed."""
    try:
        from matplotlib import cbook
    except ImportError:
        return None
    path = cbook.get_sample_data('grace_hopper.jpg', asfileobj=False)
    return str(path) if osp.isfile(path) else None


def _write_config(folder, name, template, base, **fields):
    path = folder / name
    path.write_text(template.format(base=base, backbone=TINY_BACKBONE,
                                    **fields))
    return str(path)


def _export(folder, config, make_detect_):
    """Random weights made to detect, saved as a training checkpoint, and
    the tool run on them."""
    detector = randomize_(build_detector(config), seed=1)
    make_detect_(detector)
    checkpoint = folder / 'epoch_1.pth'
    torch.save({'meta': {'epoch': 1}, 'state_dict': detector.state_dict()},
               checkpoint)
    out = folder / 'detector.onnx'
    argv = ['--config', config, '--checkpoint', str(checkpoint), '--shape',
            *EXPORT_SIZE, '--verify-sizes', '97x131', '40x52', '--out',
            str(out)]
    if _photo():
        argv += ['--image', _photo()]
    status, stdout, stderr = _run_tool(argv)
    return SimpleNamespace(status=status, stdout=stdout, stderr=stderr,
                           out=out, config=config, checkpoint=checkpoint)


@pytest.fixture(scope='module')
def retinanet_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp('retinanet')
    config = _write_config(folder, 'retinanet_tiny.py', TINY_RETINANET,
                           RETINANET_T)
    return _export(folder, config, make_retinanet_detect_)


@pytest.fixture(scope='module')
def mask_rcnn_export(tmp_path_factory):
    folder = tmp_path_factory.mktemp('mask_rcnn')
    config = _write_config(folder, 'mask_rcnn_tiny.py', TINY_MASK_RCNN,
                           MASK_RCNN_T)
    return _export(folder, config, make_two_stage_detect_)


def _table_rows(stdout):
    return [line for line in stdout.splitlines()
            if line.startswith('| ') and ('random' in line
                                          or '.jpg' in line)]


def _check_tool_run(run, outputs):
    assert run.status == 0, run.stdout + run.stderr
    assert run.out.is_file()
    assert f'outputs: {outputs} with' in run.stdout
    assert 'valid for batch 2.., height 17.., width 17..' in run.stdout
    rows = _table_rows(run.stdout)
    # export size at batch 2 (two rows), two other sizes, the photograph
    assert len(rows) == 4 + bool(_photo())
    assert all(row.endswith('| yes |') for row in rows), run.stdout
    assert 'verified:' in run.stdout
    if _photo():
        assert any('| 1x3x960x800 | grace_hopper.jpg |' in row
                   for row in rows)


def _check_new_sizes(run, masks: bool):
    """The file against mmdet's predict (the detector as mmdet builds it,
    from the checkpoint) at sizes it was never checked at, batch 3 too;
    mmdet's detections there are many and of several classes."""
    detector = build_detector(run.config, str(run.checkpoint))
    report = verify_detector_onnx(str(run.out), detector, NEW_SIZES,
                                  rows=detector_end2end(detector).max_per_img)
    assert report.passed, report.table()
    images = [image for check in report.checks for image in check.images]
    assert len(images) == 5
    assert all(image.eager_boxes >= 5 for image in images), report.table()
    if masks:
        assert all(image.min_mask_iou is not None for image in images)
    x = torch.randn(NEW_SIZES[0], generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        (sample,) = detector.predict(x, tensor_samples(x), rescale=False)
    found = sample.pred_instances
    assert len(found.labels.unique()) >= 3
    if masks:
        assert found.masks.any(dim=(1, 2)).float().mean() > 0.5


def test_tool_exports_and_verifies_retinanet(retinanet_export):
    _check_tool_run(retinanet_export, 'dets, labels')


def test_retinanet_file_matches_mmdet_at_new_sizes(retinanet_export):
    _check_new_sizes(retinanet_export, masks=False)


def test_tool_exports_and_verifies_mask_rcnn(mask_rcnn_export):
    _check_tool_run(mask_rcnn_export, 'dets, labels, masks')
    assert 'min mask IoU' in mask_rcnn_export.stdout


def test_mask_rcnn_file_matches_mmdet_at_new_sizes(mask_rcnn_export):
    _check_new_sizes(mask_rcnn_export, masks=True)


def test_file_of_other_weights_is_refused(retinanet_export):
    """The check can fail: the same file against a detector whose head
    scores differently."""
    detector = build_detector(retinanet_export.config,
                              str(retinanet_export.checkpoint))
    with torch.no_grad():
        detector.bbox_head.retina_cls.bias.add_(0.3)
    report = verify_detector_onnx(str(retinanet_export.out), detector,
                                  [(1, 3, 111, 175)])
    assert not report.passed
    assert 'NOT verified' in report.verdict()
    assert 'without a partner' in report.table()


@pytest.mark.parametrize('family', ['retinanet', 'faster_rcnn',
                                    'mask_rcnn'])
def test_deploy_forward_is_mmdets_predict_in_pytorch(family, tmp_path,
                                                     one_thread):
    """Before any export: the deploy module gives mmdet's boxes, scores,
    labels and masks, in the same order (batch 2, an untiled size)."""
    if family == 'retinanet':
        config = _write_config(tmp_path, 'tiny.py', TINY_RETINANET,
                               RETINANET_T)
        options, make_detect_ = None, make_retinanet_detect_
    else:
        config = _write_config(tmp_path, 'tiny.py', TINY_MASK_RCNN,
                               MASK_RCNN_T)
        options, make_detect_ = None, make_two_stage_detect_
        if family == 'faster_rcnn':
            options = {'model.type': 'FasterRCNN',
                       'model.roi_head.mask_roi_extractor': None,
                       'model.roi_head.mask_head': None}
    detector = make_detect_(randomize_(
        build_detector(config, cfg_options=options), seed=2))
    end2end = detector_end2end(detector)
    x = torch.randn((2, 3, 111, 175),
                    generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outputs = end2end(x)
        expected = detector.predict(x, tensor_samples(x), rescale=False)
    assert len(outputs) == (3 if family == 'mask_rcnn' else 2)
    dets, labels = outputs[:2]
    for b, sample in enumerate(expected):
        found = sample.pred_instances
        count = len(found)
        assert 5 <= count <= dets.shape[1]
        torch.testing.assert_close(dets[b, :count, :4], found.bboxes,
                                   rtol=0, atol=1e-4)
        torch.testing.assert_close(dets[b, :count, 4], found.scores,
                                   rtol=0, atol=1e-6)
        assert torch.equal(labels[b, :count], found.labels)
        assert not dets[b, count:].any() and not labels[b, count:].any()
        if family == 'mask_rcnn':
            # a pixel whose value sits at the threshold may round either way
            _, pixels = mask_agreement(outputs[2][b, :count], found.masks)
            assert int(pixels.max()) <= MASK_PIXELS
            assert not outputs[2][b, count:].any()


# -------------------------------------------------- NMS with 0, 1, n boxes
class NmsOfScoresAbove(torch.nn.Module):
    """The deploy graph's NMS stage alone: candidates above a threshold,
    per-image per-class NMS into 5 rows per image."""

    def forward(self, boxes, scores):
        from posmlp_dense.export.detection.nms import (NmsSettings,
                                                       nms_into_rows)
        batch = boxes.shape[0]
        labels = torch.arange(scores.shape[1]) % 2
        image, index = (scores > 0.5).nonzero(as_tuple=True)
        rows = nms_into_rows(boxes[image, index], scores[image, index],
                             labels[index], image, batch, 2,
                             NmsSettings(0.5, False), 5)
        return rows.boxes, rows.scores, rows.labels


# torchvision's shape function for nms calls an API torch deprecated
@pytest.mark.filterwarnings('ignore:`create_unbacked_symint`:FutureWarning')
def test_nms_rows_hold_for_no_one_and_many_kept_boxes(tmp_path):
    """torchvision declares that NMS keeps at least 2 boxes; the graph is
    right with 0 and 1 too, and past the 5 rows."""
    model = NmsOfScoresAbove().eval()
    gen = torch.Generator().manual_seed(0)
    corner = torch.rand(2, 12, 2, generator=gen) * 50
    boxes = torch.cat([corner, corner + 5 + torch.rand(
        2, 12, 2, generator=gen) * 30], -1)
    scores = torch.rand(2, 12, generator=gen)
    path = tmp_path / 'nms.onnx'
    dims = {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}
    torch.onnx.export(model, (boxes, scores), str(path), dynamo=True,
                      dynamic_shapes=(dims, dims), verbose=False)
    session = onnxruntime.InferenceSession(
        str(path), providers=['CPUExecutionProvider'])
    kept = []
    # (boxes, how many score above 0.5, boxes apart from each other)
    for count, above, apart in ((1, 0, False), (6, 1, False),
                                (6, 3, False), (20, 15, True)):
        b = torch.tensor([[[10., 10., 40., 30.]]]).repeat(1, count, 1)
        b = b + torch.arange(count)[None, :, None] * (100 if apart else 1)
        s = torch.rand(1, count, generator=gen) * 0.5
        s[0, :above] += 0.5
        got = session.run(None, {'boxes': b.numpy(), 'scores': s.numpy()})
        ref = model(b, s)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r.numpy(), rtol=0, atol=1e-5)
        kept.append(int((ref[1] > 0).sum()))
    got = session.run(None, {'boxes': boxes.numpy(),
                             'scores': scores.numpy()})  # the example
    for g, r in zip(got, model(boxes, scores)):
        np.testing.assert_allclose(g, r.numpy(), rtol=0, atol=1e-5)
    assert kept == [0, 1, 2, 5]


# ------------------------------------------------------------ mask pasting
def test_pasted_masks_are_mmdets(one_thread):
    """Separable bilinear pasting against mmdet's grid_sample pasting, with
    boxes across the border, tiny and degenerate (zero width) ones."""
    from mmdet.models.roi_heads.mask_heads.fcn_mask_head import \
        _do_paste_mask
    from posmlp_dense.export.detection.masks import paste_masks
    gen = torch.Generator().manual_seed(0)
    height, width = 45, 61
    boxes = torch.tensor([[3.2, 4.7, 30.1, 20.9], [-5., -3., 20., 50.],
                          [40.5, 10.25, 70., 44.9], [10., 10., 11.5, 10.8],
                          [7.5, 5., 7.5, 30.], [0., 0., 61., 45.]])
    probs = torch.rand(len(boxes), 28, 28, generator=gen)
    ours = paste_masks(probs, boxes, height, width, 0.5)
    for i in range(len(boxes)):
        pasted, region = _do_paste_mask(probs[i:i + 1, None], boxes[i:i + 1],
                                        height, width, skip_empty=True)
        ref = torch.zeros(height, width, dtype=torch.bool)
        ref[region] = pasted[0] >= 0.5
        assert (ours[i] ^ ref).sum() <= 1, i  # a pixel at 0.5 may flip
        assert ref.any() or i == 4


# ------------------------------------------------- box-for-box comparison
def _instances(boxes, scores, labels):
    from mmengine.structures import InstanceData
    return InstanceData(bboxes=torch.tensor(boxes, dtype=torch.float32),
                        scores=torch.tensor(scores), labels=torch.tensor(
                            labels))


def _rows(boxes, scores, labels, rows):
    dets = np.zeros((rows, 5), np.float32)
    out = np.zeros(rows, np.int64)
    dets[:len(boxes), :4], dets[:len(boxes), 4] = boxes, scores
    out[:len(boxes)] = labels
    return dets, out


def test_comparison_allows_only_a_swap_at_the_top_k_cut():
    boxes = [[0, 0, 10, 10], [20, 20, 40, 40], [50, 5, 60, 30]]
    eager = _instances(boxes, [0.9, 0.6, 0.3], [1, 0, 2])
    same = compare_image(eager, *_rows(boxes, [0.9, 0.6, 0.3], [1, 0, 2], 5),
                         None, 5, 0.99, 1e-3)
    assert same.ok and same.matched == 3 and same.max_iou_deficit == 0
    moved = compare_image(eager, *_rows(
        [[0, 0, 10, 10], [20, 20, 40, 41], [50, 5, 60, 30]],
        [0.9, 0.6, 0.3], [1, 0, 2], 5), None, 5, 0.99, 1e-3)
    assert not moved.ok and 'without a partner' in moved.problems[0]
    relabeled = compare_image(eager, *_rows(boxes, [0.9, 0.6, 0.3],
                                            [1, 1, 2], 5), None, 5, 0.99,
                              1e-3)
    assert not relabeled.ok
    # full lists (3 rows): the last box differs, at the same score
    swapped = compare_image(eager, *_rows(
        [[0, 0, 10, 10], [20, 20, 40, 40], [70, 5, 80, 30]],
        [0.9, 0.6, 0.3002], [1, 0, 2], 3), None, 3, 0.99, 1e-3)
    assert swapped.ok and swapped.at_cut == 2
    # ... not when the lists are not full
    dropped = compare_image(eager, *_rows(boxes[:2], [0.9, 0.6], [1, 0], 5),
                            None, 5, 0.99, 1e-3)
    assert not dropped.ok
    dets, labels = _rows(boxes, [0.9, 0.6, 0.3], [1, 0, 2], 5)
    dets[4, 0] = 1.0  # a padding row that is not zero
    assert 'not zero' in compare_image(eager, dets, labels, None, 5, 0.99,
                                       1e-3).problems[0]


# -------------------------------------------------- what is not exported
UNSUPPORTED = {
    'head': ('''
_base_ = [{base!r}]
model = dict(bbox_head=dict(type='FreeAnchorRetinaHead'))
''', 'bbox_head is FreeAnchorRetinaHead; the detector export supports '
        'RetinaHead there'),
    'detector': ('''
_base_ = [{base!r}]
model = dict(type='FCOS')
''', 'the detector is FCOS (single-stage)'),
    'tta': ('''
_base_ = [{base!r}]
model = dict(_delete_=True, type='DetTTAModel',
             module={{{{_base_.model}}}},
             tta_cfg=dict(nms=dict(type='nms', iou_threshold=0.5),
                          max_per_img=100))
''', 'model is DetTTAModel: test-time augmentation'),
    'soft-nms': ('''
_base_ = [{base!r}]
model = dict(test_cfg=dict(nms=dict(type='soft_nms')))
''', "test_cfg.nms.type is 'soft_nms'"),
    'test_cfg': ('''
_base_ = [{base!r}]
model = dict(test_cfg=dict(score_factor_thr=0.1))
''', 'test_cfg has score_factor_thr, which the detector export does not '
        'implement'),
}


@pytest.fixture(scope='module')
def tiny_retinanet_config(tmp_path_factory):
    folder = tmp_path_factory.mktemp('tiny_retinanet')
    return _write_config(folder, 'retinanet_tiny.py', TINY_RETINANET,
                         RETINANET_T)


@pytest.mark.parametrize('case', sorted(UNSUPPORTED))
def test_unsupported_detectors_are_refused_by_name(case, tiny_retinanet_config,
                                                   tmp_path):
    template, message = UNSUPPORTED[case]
    config = tmp_path / f'{case}.py'
    config.write_text(template.format(base=tiny_retinanet_config))
    out = tmp_path / 'x.onnx'
    status, stdout, stderr = _run_tool(['--config', str(config), '--out',
                                        str(out)])
    assert status == 2, stdout + stderr
    assert message in stderr
    assert not out.exists() and os.listdir(tmp_path) == [config.name]


def test_two_stage_settings_are_refused_by_name(tmp_path):
    config = _write_config(tmp_path, 'mask_rcnn_tiny.py', TINY_MASK_RCNN,
                           MASK_RCNN_T)
    soft_masks = {'model.test_cfg.rcnn.mask_thr_binary': -1}
    with pytest.raises(UnsupportedDetectorError,
                       match='mask_thr_binary < 0'):
        detector_end2end(build_detector(config, cfg_options=soft_masks))
    cascade = {'model.roi_head.type': 'DoubleHeadRoIHead',
               'model.roi_head.reg_roi_scale_factor': 1.3}
    with pytest.raises(UnsupportedDetectorError,
                       match='roi_head is DoubleHeadRoIHead'):
        detector_end2end(build_detector(config, cfg_options=cascade))


@pytest.mark.parametrize('config', [
    'retinanet_posmlp_t_fpn_1x_coco.py', 'retinanet_posmlp_s_fpn_1x_coco.py',
    'retinanet_posmlp_s_fpn.py', 'retinanet_posmlp_t_fpn_amp-1x_coco.py',
    'mask-rcnn_posmlp_t_fpn_1x_coco.py', 'mask-rcnn_posmlp_s_fpn_1x_coco.py',
    'demo/retinanet_posmlp_t_fpn_demo-shapes.py'])
def test_every_detector_config_has_a_deploy_graph(config):
    """Every detector config of the project builds its deploy forward
    (exporting the full-size ones is a by-hand check: docs/export.md); a
    small backbone keeps the building quick, nothing here depends on it."""
    small = {'model.backbone.arch': dict(
        _delete_=True, embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1),
        mlp_ratio=(4, 4, 4, 2), gamma=(4, 8, 16, 32),
        window_size=(14, 14, 14, 7))}
    detector = build_detector(osp.join(ROOT, 'configs', config),
                              cfg_options=small)
    end2end = detector_end2end(detector)
    assert end2end.max_per_img == 100
