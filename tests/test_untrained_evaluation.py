"""tools/test.py without a checkpoint evaluates the model as training starts
it (its init_cfg run), not PyTorch's default initialization."""
from __future__ import annotations

import os.path as osp
import sys
import types

import pytest
import torch

pytest.importorskip('mmdet')

from mmengine.config import Config  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402

from posmlp_dense.openmmlab.runtime import launch  # noqa: E402

from conftest import load_tool  # noqa: E402

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_DET = osp.join(ROOT, 'configs', 'demo',
                    'retinanet_posmlp_t_fpn_demo-shapes.py')


def _scores_of_one_image(model) -> torch.Tensor:
    from mmdet.structures import DetDataSample
    h, w = 96, 128
    sample = DetDataSample(metainfo=dict(
        img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
    image = torch.randint(0, 255, (3, h, w), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(0))
    batch = model.data_preprocessor(dict(inputs=[image],
                                         data_samples=[sample]))
    model.eval()
    with torch.no_grad():
        result, = model.predict(batch['inputs'], batch['data_samples'])
    return result.pred_instances.scores


def test_initialized_retinanet_draws_no_confident_box():
    cfg = Config.fromfile(DEMO_DET)
    init_default_scope('mmdet')
    from mmdet.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    # PyTorch's default init: class logits near 0, scores near 0.5
    assert (_scores_of_one_image(model) >= 0.5).sum() > 10
    launch.initialize_like_training(types.SimpleNamespace(model=model))
    prior = torch.sigmoid(model.bbox_head.retina_cls.bias)
    assert torch.allclose(prior, torch.full_like(prior, 0.01))
    assert (_scores_of_one_image(model) >= 0.5).sum() == 0


class _CountedInit(torch.nn.Linear):
    def __init__(self):
        super().__init__(2, 2)
        self.initialized = 0

    def init_weights(self):
        self.initialized += 1


class _FakeRunner:
    rank = 0

    def __init__(self):
        self.model = _CountedInit()

    def test(self):
        return {}


@pytest.mark.parametrize('checkpoint, initialized', [(None, 1),
                                                     ('given', 0)])
def test_test_tool_initializes_only_without_checkpoint(
        monkeypatch, tmp_path, checkpoint, initialized):
    tool = load_tool('test')
    runner = _FakeRunner()
    monkeypatch.setattr(tool.launch, 'load_config',
                        lambda *a, **k: Config(dict(load_from=None)))
    monkeypatch.setattr(tool.launch, 'build_runner', lambda cfg: runner)
    argv = ['test.py', 'config.py', '--skip-preflight']
    if checkpoint:
        path = tmp_path / 'model.pth'
        path.write_bytes(b'')
        argv.insert(2, str(path))
    monkeypatch.setattr(sys, 'argv', argv)
    tool.main()
    assert runner.model.initialized == initialized
