"""GPU readiness: PosMLP on CUDA computes what it computes on the CPU,
mixed precision trains on CUDA, mmcv's CUDA ops run, and a detector and a
segmentor train and predict on CUDA.

Every test here is marked ``gpu`` and skipped where torch sees no CUDA
device; ``pytest -m gpu tests/test_gpu.py`` runs them in the project's full
environment. The GPU check for a machine with torch and timm alone is
``python -m benchmarks.gpu_check`` (docs/gpu.md).

CUDA-against-CPU comparisons switch TF32 off for their duration (cuDNN
convolutions use it by default, which alone changes results by ~1e-3), so
both sides compute in full fp32 and differ only by summation order.
"""
from __future__ import annotations

import copy
import os

import pytest
import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason='needs a CUDA device'),
]

CUDA = torch.device('cuda')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Level maps 50x58, 25x29, 13x15, 7x8 under windows 14, 14, 14, 7: no level
# is tiled by whole windows, so partial windows are on the path.
UNTILED = (200, 232)
# Relative L2 error allowed between CUDA and CPU fp32 results.
FP32_TOLERANCE = 1e-4


@pytest.fixture
def full_fp32():
    """No TF32 in cuDNN convolutions or CUDA matmuls while a test runs."""
    saved = (torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    (torch.backends.cudnn.allow_tf32,
     torch.backends.cuda.matmul.allow_tf32) = saved


def _relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().float().cpu(), ref.detach().float().cpu()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _loss(outs, seed: int = 1) -> torch.Tensor:
    """sum_i mean(out_i * r_i) with fixed random r_i (made on the CPU, so
    the CPU and CUDA runs weight their outputs alike)."""
    gen = torch.Generator().manual_seed(seed)
    return sum((o.float() * torch.randn(o.shape, generator=gen).to(
        o.device)).mean() for o in outs)


def _run(model, x, train: bool):
    """Outputs and, in train mode, gradients of ``_loss``."""
    model.train(train)
    model.zero_grad(set_to_none=True)
    if not train:
        with torch.no_grad():
            return model(x), {}
    outs = model(x)
    _loss(outs).backward()
    return outs, {n: p.grad for n, p in model.named_parameters()
                  if p.grad is not None}


@pytest.mark.parametrize('train', [False, True], ids=['eval', 'train'])
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe', 'sgu'])
def test_cuda_matches_cpu(gate, train, full_fp32):
    torch.manual_seed(0)
    cpu_model = randomize_(PosMLP(TINY_ARCH, gate=gate, drop_path_rate=0.0))
    cuda_model = copy.deepcopy(cpu_model).to(CUDA)
    x = torch.randn(2, 3, *UNTILED, generator=torch.Generator().manual_seed(0))
    ref_outs, ref_grads = _run(cpu_model, x, train)
    outs, grads = _run(cuda_model, x.to(CUDA), train)
    assert [o.shape for o in outs] == [o.shape for o in ref_outs]
    for level, (o, r) in enumerate(zip(outs, ref_outs)):
        assert o.is_cuda
        err = _relative(o, r)
        assert err <= FP32_TOLERANCE, f'level {level}: {err:.3g}'
    if not train:
        return
    assert set(grads) == set(ref_grads)
    assert len(grads) == len(list(cpu_model.parameters()))
    total = torch.cat([g.flatten() for g in ref_grads.values()]).norm()
    for name, g in grads.items():
        diff = (g.cpu() - ref_grads[name]).norm()
        # a gradient that is zero in exact arithmetic (the stem conv biases
        # before train-mode BatchNorms) is rounding noise on both sides:
        # judged against the gradients' overall size
        assert diff <= FP32_TOLERANCE * ref_grads[name].norm() \
            + 1e-6 * total, f'{name}: {diff:.3g}'


def _posmlp_t_step_inputs(batch: int = 2, size=(512, 512)):
    torch.manual_seed(0)
    model = PosMLP('t', drop_path_rate=0.1).to(CUDA).train()
    x = torch.randn(batch, 3, *size, device=CUDA)
    return model, x


def test_fp16_autocast_training_step_with_grad_scaler_stays_finite():
    model, x = _posmlp_t_step_inputs()
    with torch.no_grad():
        torch.manual_seed(1)
        fp32 = model(x)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # a fixed scale (it would only grow after 2000 steps): any overflow
    # shows as a lowered scale
    scaler = torch.amp.GradScaler('cuda', init_scale=1024.0)
    first_scale = scaler.get_scale()
    for step in range(3):
        optimizer.zero_grad(set_to_none=True)
        torch.manual_seed(1)
        with torch.autocast('cuda', dtype=torch.float16):
            outs = model(x)
            loss = sum(o.float().square().mean() for o in outs)
        assert torch.isfinite(loss), f'step {step}: loss {loss.item()}'
        if step == 0:  # autocast did compute in half precision
            assert any(_relative(o, r) > 1e-5 for o, r in zip(outs, fp32))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        for name, p in model.named_parameters():
            assert p.grad is not None, name
            assert torch.isfinite(p.grad).all(), f'step {step}: {name}'
        scaler.step(optimizer)
        scaler.update()
        # the scaler lowers its scale only after finding inf/NaN gradients
        assert scaler.get_scale() >= first_scale, f'step {step}'
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all(), name


def test_bf16_autocast_forward_backward():
    model, x = _posmlp_t_step_inputs(batch=1, size=UNTILED)
    torch.manual_seed(1)
    ref = [o.detach() for o in model(x)]
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with torch.autocast('cuda', dtype=torch.bfloat16):
        outs = model(x)
    _loss(outs).backward()
    for level, (o, r) in enumerate(zip(outs, ref)):
        assert torch.isfinite(o).all(), f'level {level}'
        err = _relative(o, r)
        # bf16 keeps 8 mantissa bits: close to fp32, yet not equal
        assert 1e-5 < err <= 3e-2, f'level {level}: {err:.3g}'
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


# ---------------------------------------------------------------- mmcv ops
def _mmcv_ops_with_cuda():
    ops = pytest.importorskip('mmcv.ops')
    version = ops.get_compiling_cuda_version()
    assert version not in ('', 'not available'), (
        f'mmcv {__import__("mmcv").__version__} was built without CUDA ops '
        f'(get_compiling_cuda_version() = {version!r}); on a machine with a '
        f'CUDA toolkit rebuild them with `FORCE_CUDA=1 make env`')
    return ops


def test_mmcv_nms_on_cuda_matches_cpu():
    ops = _mmcv_ops_with_cuda()
    gen = torch.Generator().manual_seed(0)
    corner = torch.rand(300, 2, generator=gen) * 200
    boxes = torch.cat([corner, corner + 20 + 40 * torch.rand(
        300, 2, generator=gen)], 1)
    scores = torch.rand(300, generator=gen)
    dets_cpu, keep_cpu = ops.nms(boxes, scores, 0.5)
    dets_cuda, keep_cuda = ops.nms(boxes.to(CUDA), scores.to(CUDA), 0.5)
    assert keep_cuda.is_cuda
    assert 0 < len(keep_cpu) < 300  # it suppressed some, not all
    assert torch.equal(keep_cuda.cpu(), keep_cpu)
    torch.testing.assert_close(dets_cuda.cpu(), dets_cpu)


def test_mmcv_roi_align_on_cuda_matches_cpu(full_fp32):
    ops = _mmcv_ops_with_cuda()
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(2, 16, 32, 40, generator=gen)
    corner = torch.rand(20, 2, generator=gen) * 100
    rois = torch.cat([torch.randint(0, 2, (20, 1), generator=gen).float(),
                      corner, corner + 10 + 50 * torch.rand(
                          20, 2, generator=gen)], 1)
    align = ops.RoIAlign((7, 7), spatial_scale=0.25, sampling_ratio=2,
                         aligned=True)
    results = {}
    for which, device in (('cpu', torch.device('cpu')), ('cuda', CUDA)):
        feats = features.to(device).requires_grad_()
        out = align(feats, rois.to(device))
        out.square().sum().backward()
        results[which] = (out.detach().cpu(), feats.grad.cpu())
    assert results['cuda'][0].abs().sum() > 0
    torch.testing.assert_close(results['cuda'][0], results['cpu'][0],
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results['cuda'][1], results['cpu'][1],
                               rtol=1e-4, atol=1e-5)


# ------------------------------------------------- detector and segmentor
def _build(config: str, scope: str, pad_to=None):
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(os.path.join(ROOT, 'configs', config))
    cfg.model.backbone.init_cfg = None  # no ImageNet weights in tests
    if pad_to is not None:
        cfg.model.data_preprocessor.size = pad_to
    init_default_scope(scope)
    if scope == 'mmdet':
        from mmdet.registry import MODELS
    else:
        from mmseg.registry import MODELS
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    return model, cfg


def _images(n: int, size, gen):
    return [torch.randint(0, 256, (3, *size), generator=gen,
                          dtype=torch.uint8) for _ in range(n)]


def test_detector_trains_and_predicts_on_cuda(full_fp32):
    pytest.importorskip('mmdet')
    _mmcv_ops_with_cuda()  # the focal loss and NMS run as mmcv CUDA ops
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    model, _ = _build('retinanet_posmlp_t_fpn_1x_coco.py', 'mmdet')
    gen = torch.Generator().manual_seed(0)
    h, w = 256, 320
    samples = []
    for _ in range(2):
        sample = DetDataSample(metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor([[20.0, 30.0, 120.0, 150.0],
                                 [150.0, 60.0, 300.0, 240.0]]),
            labels=torch.tensor([3, 17]))
        samples.append(sample)
    data = dict(inputs=_images(2, (h, w), gen), data_samples=samples)

    # the raw head outputs agree with the CPU's (eval mode)
    cuda_model = copy.deepcopy(model).to(CUDA).eval()
    model.eval()
    with torch.no_grad():
        batch = model.data_preprocessor(copy.deepcopy(data), False)
        ref = model(batch['inputs'], mode='tensor')
        batch = cuda_model.data_preprocessor(copy.deepcopy(data), False)
        assert batch['inputs'].is_cuda
        got = cuda_model(batch['inputs'], mode='tensor')
    ref = [t for group in ref for t in group]
    got = [t for group in got for t in group]
    assert len(got) == len(ref) == 10  # class and box maps of 5 levels
    for i, (g, r) in enumerate(zip(got, ref)):
        assert _relative(g, r) <= FP32_TOLERANCE, f'head output {i}'

    # a training step: real losses, finite, gradients reach the backbone
    cuda_model.train()
    batch = cuda_model.data_preprocessor(copy.deepcopy(data), True)
    losses = cuda_model(**batch, mode='loss')
    loss, _ = cuda_model.parse_losses(losses)
    assert loss.is_cuda and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in cuda_model.backbone.parameters()]
    assert all(g is not None and g.is_cuda and torch.isfinite(g).all()
               for g in grads)

    # prediction: boxes on CUDA after NMS
    cuda_model.eval()
    with torch.no_grad():
        results = cuda_model.test_step(copy.deepcopy(data))
    assert len(results) == 2
    for r in results:
        boxes = r.pred_instances.bboxes
        assert boxes.is_cuda and boxes.shape[-1] == 4
        assert torch.isfinite(boxes).all()


def test_segmentor_trains_and_predicts_on_cuda():
    pytest.importorskip('mmseg')
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    h, w = 256, 320
    model, cfg = _build('fpn_posmlp_t_4xb4-40k_ade20k-512x512.py', 'mmseg',
                        pad_to=(h, w))
    assert cfg.model.decode_head.num_classes == 150
    model = model.to(CUDA).train()
    gen = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(2):
        sample = SegDataSample(metainfo=dict(img_shape=(h, w),
                                             ori_shape=(h, w)))
        sample.gt_sem_seg = PixelData(
            data=torch.randint(0, 150, (1, h, w), generator=gen))
        samples.append(sample)
    data = dict(inputs=_images(2, (h, w), gen), data_samples=samples)
    batch = model.data_preprocessor(copy.deepcopy(data), True)
    losses = model(**batch, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert loss.is_cuda and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all()
               for p in model.backbone.parameters())
    model.eval()
    with torch.no_grad():
        results = model.test_step(copy.deepcopy(data))
    assert len(results) == 2
    for r in results:
        pred = r.pred_sem_seg.data
        assert pred.is_cuda and tuple(pred.shape[-2:]) == (h, w)
        assert 0 <= int(pred.min()) and int(pred.max()) < 150
