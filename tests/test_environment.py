"""The environment that `make env` builds: the OpenMMLab stack with mmcv's
compiled ops, the pinned versions, one OpenCV, and the package itself."""
import importlib
import importlib.metadata as md
import os
import re

import pytest
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pinned(name):
    """The version that requirements/mm.txt pins for a package."""
    path = os.path.join(REPO_ROOT, 'requirements', 'mm.txt')
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if line.startswith(name + '=='):
                return line.split('==', 1)[1]
    raise AssertionError(f'{name} is not pinned in requirements/mm.txt')


def test_mmcv_has_compiled_ops():
    import mmcv
    assert mmcv.__version__ == pinned('mmcv')
    ext = importlib.import_module('mmcv._ext')
    assert hasattr(ext, 'nms')
    from mmcv.ops import RoIAlign, nms  # noqa: F401
    # 'not available' for CPU-only ops, a CUDA version string otherwise.
    assert isinstance(ext.get_compiling_cuda_version(), str)


def test_mmcv_nms_on_cpu_keeps_expected_boxes():
    from mmcv.ops import nms
    boxes = torch.tensor([
        [0.0, 0.0, 10.0, 10.0],   # 0: overlaps box 3 (IoU ~0.95)
        [1.0, 1.0, 11.0, 11.0],   # 1: overlaps box 3 (IoU ~0.72)
        [20.0, 20.0, 30.0, 30.0],  # 2: far from the others
        [0.0, 0.0, 10.0, 10.5],   # 3: best score
    ])
    scores = torch.tensor([0.9, 0.8, 0.7, 0.95])
    dets, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [3, 2]
    assert dets.shape == (2, 5)
    torch.testing.assert_close(dets[:, 4], torch.tensor([0.95, 0.7]))
    torch.testing.assert_close(dets[:, :4], boxes[[3, 2]])

    # With a threshold above every overlap, nothing is suppressed.
    _, keep_all = nms(boxes, scores, iou_threshold=0.99)
    assert sorted(keep_all.tolist()) == [0, 1, 2, 3]


def test_mmcv_roi_align_on_cpu_matches_hand_values_and_torchvision():
    from mmcv.ops import RoIAlign
    from torchvision.ops import roi_align as tv_roi_align

    # Feature value = column index, so bilinear sampling returns the sampled
    # x coordinate: with aligned=True the box [0, 4) has bins centred on
    # samples x = {0, 1} and {2, 3}, i.e. means 0.5 and 2.5.
    feat = torch.arange(6, dtype=torch.float32).repeat(1, 1, 6, 1)
    rois = torch.tensor([[0.0, 0.0, 0.0, 4.0, 4.0]])
    op = RoIAlign(output_size=(2, 2), spatial_scale=1.0, sampling_ratio=2,
                  pool_mode='avg', aligned=True)
    out = op(feat, rois)
    expected = torch.tensor([[[[0.5, 2.5], [0.5, 2.5]]]])
    torch.testing.assert_close(out, expected)

    feat = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    rois = torch.tensor([[0.0, 1.0, 2.0, 9.5, 12.0],
                         [1.0, 0.0, 0.0, 15.0, 15.0]])
    ours = op(feat, rois)
    theirs = tv_roi_align(feat, rois, output_size=(2, 2), spatial_scale=1.0,
                          sampling_ratio=2, aligned=True)
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize('module,dist', [('mmengine', 'mmengine'),
                                         ('mmdet', 'mmdet'),
                                         ('mmseg', 'mmsegmentation')])
def test_openmmlab_versions_are_the_pinned_ones(module, dist):
    mod = importlib.import_module(module)
    assert mod.__version__ == pinned(dist)
    assert md.version(dist) == pinned(dist)


def test_model_zoos_import():
    import mmdet.models
    import mmseg.models
    from mmdet.registry import MODELS as DET_MODELS
    from mmseg.registry import MODELS as SEG_MODELS
    assert hasattr(mmdet.models, 'MaskRCNN')
    assert hasattr(mmseg.models, 'UPerHead')
    # The registries are populated once the model modules are imported.
    assert DET_MODELS.get('MaskRCNN') is mmdet.models.MaskRCNN
    assert SEG_MODELS.get('UPerHead') is mmseg.models.UPerHead


def test_timm_and_torch_versions():
    import timm
    assert re.match(r'1\.0\.\d+', timm.__version__), timm.__version__
    major, minor = (int(x) for x in torch.__version__.split('.')[:2])
    assert (major, minor) >= (2, 1)
    model = timm.create_model('resnet18', pretrained=False, num_classes=7)
    model.eval()
    with torch.no_grad():
        out = model(torch.zeros(1, 3, 32, 32))
    assert out.shape == (1, 7)


def test_exactly_one_opencv_and_it_is_headless():
    names = sorted({(d.metadata['Name'] or '').lower()
                    for d in md.distributions()
                    if (d.metadata['Name'] or '').lower().startswith('opencv')})
    assert names == ['opencv-python-headless']
    import cv2
    assert int(cv2.__version__.split('.')[0]) >= 4


def test_setuptools_keeps_pkg_resources_for_mmengine(tmp_path):
    import setuptools
    assert int(setuptools.__version__.split('.')[0]) < 82
    importlib.import_module('pkg_resources')

    # mmengine resolves 'mmdet::' config paths through pkg_resources.
    from mmengine.config import Config
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text("_base_ = ['mmdet::_base_/default_runtime.py']\n"
                        'custom_value = 3\n')
    cfg = Config.fromfile(str(cfg_file))
    assert cfg.custom_value == 3
    assert cfg.default_scope == 'mmdet'


def test_project_version_matches_installed_metadata():
    from posmlp_dense.version import __version__
    assert re.match(r'\d+\.\d+\.\d+', __version__)
    assert md.version('posmlp_dense') == __version__
