"""Training cost: backbone training steps and whole detector iterations,
their peak memory and the activations autograd keeps for the backward.

A *backbone step* is the backbone alone in train mode: forward, the sum of
the first half of every returned level's output channels as the loss,
backward (``measure.make_step``). A
*detector iteration* is mmengine's ``model.train_step`` of a RetinaNet on
one synthetic batch: data preprocessing, forward, the real RetinaNet
losses (focal and L1), backward and an AdamW update. RetinaNet-Swin-T is
mmdet's own config (``swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py``), and
RetinaNet-PosMLP-T is that config with only its backbone replaced, so both
have the same FPN neck and RetinaNet head.

Peak memory on a CPU comes from a fresh Python process per case
(``python -m benchmarks.fresh_process``): an allocator keeps
freed memory for reuse, so in a process that has already run other models
the resident set does not grow by what a step needs. On CUDA the caching
allocator's own statistics are exact, and the cases are measured in the
timing process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .measure import (SOURCE_ROOT, Job, PeakMemory, SavedActivations,
                      count_macs, fmt, log, make_input, median_faults,
                      model_job, run_jobs, set_mode)
from .models import LABELS, build_models, count_params, mmdet_models

KINDS = ('backbone', 'detector')
# The backbones a RetinaNet can be built with here.
DETECTOR_BACKBONES = ('posmlp_t', 'swin_t')
DETECTOR_LABELS = {'posmlp_t': 'RetinaNet-PosMLP-T',
                   'swin_t': 'RetinaNet-Swin-T'}
# mmdet's RetinaNet-Swin-T config, among the configs its package ships
SWIN_RETINANET_CONFIG = 'swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py'
MEMORY_MODES = ('fresh', 'inprocess', 'none')
# Ground-truth boxes per synthetic image.
NUM_BOXES = 8


@dataclasses.dataclass(frozen=True)
class TrainingCase:
    """One row of the training table."""
    kind: str                    # 'backbone' or 'detector'
    model: str                   # a backbone name of ``models.ALL_MODELS``
    with_cp: bool
    shape: Tuple[int, int, int]  # batch, height, width

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f'unknown kind {self.kind!r}; choose from '
                             f'{KINDS}')
        if self.kind == 'detector' and self.model not in DETECTOR_BACKBONES:
            raise ValueError(f'no RetinaNet with backbone {self.model!r}; '
                             f'choose from {DETECTOR_BACKBONES}')

    @property
    def label(self) -> str:
        name = (DETECTOR_LABELS if self.kind == 'detector'
                else LABELS)[self.model]
        return name + (' (with_cp)' if self.with_cp else '')

    def as_dict(self) -> dict:
        return dict(kind=self.kind, model=self.model, with_cp=self.with_cp,
                    shape=list(self.shape))

    @classmethod
    def from_dict(cls, d: dict) -> 'TrainingCase':
        return cls(d['kind'], d['model'], bool(d['with_cp']),
                   tuple(int(v) for v in d['shape']))


def shape_name(shape: Sequence[int]) -> str:
    return 'x'.join(str(v) for v in shape)


def build_detector(backbone: str, with_cp: bool = False,
                   posmlp_arch: Optional[dict] = None) -> nn.Module:
    """RetinaNet from mmdet's Swin-T config, with its backbone or PosMLP-T
    (same settings as ``configs/retinanet_posmlp_t_fpn_1x_coco.py``);
    random weights, initialized by ``init_weights`` (the head's prior
    bias as in training). ``posmlp_arch`` replaces PosMLP-T's arch."""
    import mmdet
    from mmengine.config import Config
    import posmlp_dense  # noqa: F401  (registers PosMLP with mmdet)
    path = os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs',
                        SWIN_RETINANET_CONFIG)
    if not os.path.exists(path):
        raise FileNotFoundError(f'mmdet {mmdet.__version__} ships no '
                                f'{SWIN_RETINANET_CONFIG} (looked in {path})')
    cfg = Config.fromfile(path).model
    if backbone == 'posmlp_t':
        cfg.backbone = dict(type='PosMLP', arch=posmlp_arch or 't',
                            gate='gqpe', out_indices=(1, 2, 3),
                            drop_path_rate=0.2, with_cp=with_cp)
        if posmlp_arch is not None:  # (tests) the neck takes its widths
            cfg.neck.in_channels = list(posmlp_arch['embed_dims'])[1:]
    elif backbone == 'swin_t':
        cfg.backbone.with_cp = with_cp
        cfg.backbone.init_cfg = None  # no download of the ImageNet weights
    else:
        raise ValueError(f'no RetinaNet with backbone {backbone!r}; choose '
                         f'from {DETECTOR_BACKBONES}')
    model = mmdet_models().build(cfg)
    model.init_weights()
    return model


def detection_batch(shape: Sequence[int], seed: int) -> dict:
    """A batch of ``shape`` = (images, height, width) random uint8 images
    with ``NUM_BOXES`` random boxes each, as a data loader gives it to
    ``train_step``."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    batch, h, w = shape
    gen = torch.Generator().manual_seed(seed)
    inputs, samples = [], []
    size = torch.tensor([w, h], dtype=torch.float32)
    for _ in range(batch):
        inputs.append(torch.randint(0, 256, (3, h, w), generator=gen,
                                    dtype=torch.uint8))
        corner = torch.rand(NUM_BOXES, 2, generator=gen) * 0.8 * size
        extent = (0.05 + 0.15 * torch.rand(NUM_BOXES, 2, generator=gen)) \
            * size
        boxes = torch.cat([corner, torch.minimum(corner + extent, size)], 1)
        sample = DetDataSample(metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=boxes,
            labels=torch.randint(0, 80, (NUM_BOXES,), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def stem_modules(model: nn.Module) -> Tuple[nn.Module, nn.Module]:
    """The first and the last module of a backbone's stem: the layers
    before its first level (stage), which map the image to stride 4."""
    if hasattr(model, 'patch_embed'):  # PosMLP's ConvStem, Swin's PatchEmbed
        return model.patch_embed, model.patch_embed
    if hasattr(model, 'conv1') and hasattr(model, 'maxpool'):  # ResNet
        return model.conv1, model.maxpool
    raise ValueError(f'no known stem in {type(model).__name__}')


class StemClock:
    """Splits the time of a backbone's training steps into its stem and
    the rest, within the same steps (no extra run).

    The stem is the first thing the forward runs, and its backward is the
    last thing the backward runs (it is the first layer). Hooks take the
    time when the stem's forward starts and ends, and when the gradient of
    its output arrives; the stem's share of a step is its forward plus
    everything from that gradient's arrival to the step's end (its
    backward, and its parameters' gradient accumulation). On CUDA each
    time is taken after a synchronization.
    """

    def __init__(self, model: nn.Module, device: torch.device):
        self.device = device
        self.times: List[Optional[float]] = []
        self._marks: Dict[str, float] = {}
        first, last = stem_modules(model)
        first.register_forward_pre_hook(self._forward_start)
        last.register_forward_hook(self._forward_end)

    def _now(self) -> float:
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _forward_start(self, module, args):
        self._marks['forward_start'] = self._now()

    def _forward_end(self, module, args, output):
        self._marks['forward_end'] = self._now()
        # Swin's PatchEmbed returns (tokens, (h, w))
        out = output[0] if isinstance(output, (tuple, list)) else output
        if out.requires_grad:
            out.register_hook(self._backward_start)

    def _backward_start(self, grad):
        self._marks['backward_start'] = self._now()

    def timing(self, step):
        """``step`` with its stem time appended to ``times`` (None when a
        mark is missing, e.g. a stem that did not run)."""
        def run():
            self._marks.clear()
            step()
            end = self._now()
            m = self._marks
            if len(m) < 3:
                self.times.append(None)
            else:
                self.times.append(m['forward_end'] - m['forward_start']
                                  + end - m['backward_start'])
        return run


def training_job(case: TrainingCase, device: torch.device, seed: int = 0,
                 posmlp_arch: Optional[dict] = None
                 ) -> Tuple[Job, nn.Module]:
    """The job of one case (model built, in train mode, on ``device``) and
    its model. A backbone's model carries a ``StemClock`` as
    ``model.stem_clock``."""
    batch, h, w = case.shape
    key = (case.kind, case.model, case.with_cp, case.shape)
    if case.kind == 'backbone':
        model = build_models([case.model], posmlp_arch, seed,
                             case.with_cp)[case.model].to(device)
        set_mode(model, 'fwdbwd')
        x = make_input((h, w), batch, device, seed)
        job = model_job(key, case.label, model, x, 'fwdbwd')
        model.stem_clock = StemClock(model, device)
        return dataclasses.replace(
            job, step=model.stem_clock.timing(job.step)), model
    from mmengine.optim import OptimWrapper
    torch.manual_seed(seed)
    model = build_detector(case.model, case.with_cp, posmlp_arch).to(device)
    model.train()
    data = detection_batch(case.shape, seed)
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-4,
                                           weight_decay=0.05))
    # update_params inside train_step sets the gradients to None again
    return Job(key, case.label, lambda: model.train_step(data, optim)), model


def footprint(job: Job, model: nn.Module, device: torch.device,
              batch: int) -> dict:
    """Peak memory growth of two steps of ``job`` (the first, then a
    repeated one) and the activation bytes autograd saves, per image."""
    peaks = []
    for _ in range(2):
        with PeakMemory(device) as mem:
            job.step()
            if device.type == 'cuda':
                torch.cuda.synchronize(device)
        job.reset()
        peaks.append(mem.peak)
    held = list(model.parameters()) + list(model.buffers())
    with SavedActivations(exclude=held) as saved:
        job.step()
    job.reset()

    def mb(v):
        return None if v is None else v / 2 ** 20
    return dict(peak_first_step_mb=mb(peaks[0]), peak_mb=mb(peaks[1]),
                peak_method=mem.method,
                saved_activation_mb_per_image=mb(saved.activation_bytes
                                                 / batch),
                saved_parameter_mb=mb(saved.excluded_bytes))


def footprint_in_fresh_process(case: TrainingCase, device: torch.device,
                               seed: int, posmlp_arch: Optional[dict],
                               timeout: float = 1800) -> dict:
    """``footprint`` of ``case`` in a new Python process that runs nothing
    else (see ``fresh_process``)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, 'footprint.json')
        spec = dict(case=case.as_dict(), device=str(device), seed=seed,
                    posmlp_arch=posmlp_arch, out=out)
        # cwd: ``-m`` then imports this very copy of benchmarks and
        # posmlp_dense
        proc = subprocess.run(
            [sys.executable, '-m', 'benchmarks.fresh_process',
             json.dumps(spec)], cwd=SOURCE_ROOT, capture_output=True,
            text=True, timeout=timeout)
        if proc.returncode != 0 or not os.path.exists(out):
            why = (f'killed by signal {-proc.returncode} (out of memory?)'
                   if proc.returncode < 0 else f'exit {proc.returncode}')
            raise RuntimeError(
                f'measuring {case.label} {shape_name(case.shape)} in a fresh '
                f'process failed ({why}):\n{proc.stderr[-3000:]}')
        with open(out) as f:
            return json.load(f)


def run_training(cases: Sequence[TrainingCase], repeats: int, warmup: int,
                 device: torch.device, memory: str = 'fresh', seed: int = 0,
                 posmlp_arch: Optional[dict] = None,
                 mem_interval: float = 0.001, start: float = 0.0,
                 flop_count: Optional[str] = 'fake') -> List[dict]:
    """One row per case: step times (cases of the same kind and shape are
    interleaved round by round in this process) and, unless ``memory`` is
    'none', the ``footprint`` (measured in a fresh process per case with
    'fresh', in this one with 'inprocess'). ``flop_count``: how backbone
    steps' FLOPs are counted, 'fake' or 'real' tensors (``count_macs``),
    or None: not counted."""
    if memory not in MEMORY_MODES:
        raise ValueError(f'unknown memory mode {memory!r}; choose from '
                         f'{MEMORY_MODES}')
    groups: Dict[tuple, List[TrainingCase]] = {}
    for case in cases:
        groups.setdefault((case.kind, case.shape), []).append(case)
    rows = []
    for (kind, shape), group in groups.items():
        built = {case: training_job(case, device, seed, posmlp_arch)
                 for case in group}
        runs = run_jobs([job for job, _ in built.values()], repeats, warmup,
                        device, mem_interval,
                        lambda key: f'train {key[0]:<8s} {shape_name(key[3])}',
                        start, measure_peak=False)
        for case, (job, model) in built.items():
            times = runs[job.key]['times']
            med = statistics.median(times)
            row = dict(case.as_dict(), label=case.label, times=times,
                       warmup_times=runs[job.key]['warmup_times'],
                       median_s=med, min_s=min(times), max_s=max(times),
                       images_per_s=shape[0] / med,
                       page_faults=median_faults(runs[job.key]['faults']),
                       params=count_params(model), memory=memory)
            if kind == 'detector':
                row['backbone_params'] = count_params(model.backbone)
            else:
                # the model's last steps so far are its timed rounds (the
                # footprint's steps come after)
                row.update(stem_split(model.stem_clock.times[-repeats:],
                                      times))
                if flop_count is not None:
                    row.update(step_flops(model, shape, med, device,
                                          fake=flop_count == 'fake'))
                log(f'train backbone {shape_name(shape)}  {case.label}: '
                    f'stem {fmt(row["stem_median_s"], ".3f")} s of a '
                    f'{med:.3f} s step (medians); '
                    f'{fmt(row.get("gflop_per_image"), ".1f")} GFLOP per '
                    f'image, {fmt(row.get("achieved_gflops"), ".1f")} '
                    f'GFLOP/s', start)
            if memory == 'inprocess':
                row.update(footprint(job, model, device, shape[0]))
                row['peak_first_step_mb'] = None  # not the process's first
                log_footprint(row, start)
            rows.append(row)
        # free this group's models before the next group or a fresh process
        del built, runs, job, model
        if device.type == 'cuda':
            torch.cuda.empty_cache()
        if memory == 'fresh':
            for case, row in zip(group, rows[-len(group):]):
                row.update(footprint_in_fresh_process(case, device, seed,
                                                      posmlp_arch))
                log_footprint(row, start)
    return rows


def step_flops(model: nn.Module, shape: Sequence[int], median_s: float,
               device: torch.device, fake: bool = True) -> dict:
    """FLOPs of one backbone training step per image (forward and backward,
    as torch's FlopCounterMode counts them: matmuls and convolutions, no
    elementwise work), and the rate the timed steps achieved. Next to the
    matmul calibration this says how much of a step is other work: two
    models with the same FLOPs can differ in time only there."""
    batch, h, w = shape
    macs, _, how = count_macs(model, (h, w), 'fwdbwd', device, fake)
    set_mode(model, 'fwdbwd')  # (count_macs leaves the model in eval mode)
    gflop = 2 * macs / 1e9
    return dict(gflop_per_image=gflop, gflop_counted=how,
                achieved_gflops=gflop * batch / median_s)


def stem_split(stem_times: Sequence[Optional[float]],
               step_times: Sequence[float]) -> dict:
    """The stem's time in each timed step, and the medians of the stem and
    of the rest of the step (each step's time less its stem's)."""
    if len(stem_times) != len(step_times) or None in stem_times:
        return dict(stem_times=list(stem_times), stem_median_s=None,
                    without_stem_median_s=None)
    return dict(stem_times=list(stem_times),
                stem_median_s=statistics.median(stem_times),
                without_stem_median_s=statistics.median(
                    t - s for t, s in zip(step_times, stem_times)))


def log_footprint(row: dict, start: float):
    log(f'train {row["kind"]:<8s} {shape_name(row["shape"])}  '
        f'{row["label"]}: peak growth {fmt(row["peak_first_step_mb"], ".0f")}'
        f' MB (first step), {fmt(row["peak_mb"], ".0f")} MB (repeated); '
        f'saved activations '
        f'{fmt(row["saved_activation_mb_per_image"], ".1f")} MB/image', start)
