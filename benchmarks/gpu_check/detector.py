"""Tier 2, the OpenMMLab stack (optional): the benchmark's RetinaNet-PosMLP-T
against RetinaNet-Swin-T (``benchmarks.detectors``), a training iteration
and a predict each. Where mmengine, mmcv or mmdet cannot be imported, or
mmcv's ops lack CUDA, both checks are skipped and say why."""
from __future__ import annotations

import copy
from typing import List, Optional, Tuple

import torch

from posmlp_dense.optional_deps import is_installed
from ..models import count_params
from ..timing import MB, interleaved, peak_memory
from .rows import Skip, Verdict, ms

MM_PACKAGES = ('mmengine', 'mmcv', 'mmdet')
BACKBONES = ('posmlp_t', 'swin_t')


def require_openmmlab(device: torch.device):
    """Raise Skip naming what is missing for the detector checks."""
    missing = [name for name in MM_PACKAGES if not is_installed(name)]
    if missing:
        raise Skip(f'{", ".join(missing)} not importable here (tier 2 needs '
                   f"the OpenMMLab stack with mmcv's compiled ops)")
    try:
        from mmcv.ops import get_compiling_cuda_version
    except ImportError as err:
        raise Skip(f"mmcv's compiled ops are not importable: {err}") from err
    version = get_compiling_cuda_version()
    if device.type == 'cuda' and version in ('', 'not available'):
        raise Skip(f"mmcv's ops were built without CUDA "
                   f"(get_compiling_cuda_version() = {version!r})")


class Detectors:
    """The two RetinaNets and their batch, built by the first check that
    needs them (a failure to build fails each check)."""

    def __init__(self, arch, shape: Tuple[int, int, int],
                 device: torch.device, seed: int):
        self.arch, self.shape = arch, shape
        self.device, self.seed = device, seed
        self._built: Optional[dict] = None

    def get(self) -> dict:
        if self._built is None:
            require_openmmlab(self.device)
            from ..detectors import DETECTOR_LABELS, training_iteration
            arch = None if self.arch == 't' else dict(self.arch)
            self._built = {name: dict(zip(
                ('step', 'model', 'data'), training_iteration(
                    name, tuple(self.shape), self.device, self.seed, arch)),
                label=DETECTOR_LABELS[name]) for name in BACKBONES}
        return self._built


def _row(name: str, built: dict, run: dict, memory, shape) -> dict:
    return dict(kind='detector', model=name, with_cp=False,
                shape=list(shape), label=built['label'], times=run['times'],
                median_s=run['median_s'], min_s=run['min_s'],
                max_memory_allocated_mb=None if memory.allocated is None
                else memory.allocated / MB,
                peak_mb=None if memory.peak is None else memory.peak / MB,
                params=count_params(built['model']))


def _describe(rows: List[dict], repeats: int, warmup: int) -> str:
    parts = [f"{row['label']} {ms(row['median_s'])}" + (
        '' if row['max_memory_allocated_mb'] is None else
        f", max_memory_allocated {row['max_memory_allocated_mb']:.0f} MB")
        for row in rows]
    ours, swin = rows
    return (f'median of {repeats} after {warmup} warm-up: '
            + ' | '.join(parts) + ' | time ratio '
            f"{ours['median_s'] / swin['median_s']:.2f}")


def train_iteration(detectors: Detectors, warmup: int, repeats: int
                    ) -> Tuple[Verdict, List[dict]]:
    """``model.train_step`` (preprocessing, forward, losses, backward,
    AdamW) of both detectors, interleaved; report rows of kind
    'detector'."""
    built = detectors.get()
    runs = interleaved({n: b['step'] for n, b in built.items()}, repeats,
                       warmup, detectors.device)
    rows = [_row(name, b, runs[name], peak_memory(b['step'],
                                                  detectors.device),
                 detectors.shape) for name, b in built.items()]
    return Verdict(True, _describe(rows, repeats, warmup)), rows


def predict(detectors: Detectors, warmup: int, repeats: int
            ) -> Tuple[Verdict, List[dict]]:
    """``model.test_step`` of both detectors in eval mode; every image
    gets finite boxes on the device."""
    built, device = detectors.get(), detectors.device
    results = {}

    def job(name):
        def run():
            with torch.no_grad():
                results[name] = built[name]['model'].test_step(
                    copy.deepcopy(built[name]['data']))
        return run
    jobs = {name: job(name) for name in built}
    for b in built.values():
        b['model'].eval()
    try:
        runs = interleaved(jobs, repeats, warmup, device)
        memory = {name: peak_memory(jobs[name], device) for name in jobs}
    finally:
        for b in built.values():
            b['model'].train()
    problems = []
    for name, out in results.items():
        boxes = [r.pred_instances.bboxes for r in out]
        if len(out) != detectors.shape[0]:
            problems.append(f'{name}: {len(out)} results for '
                            f'{detectors.shape[0]} images')
        elif not all(b.device.type == device.type and b.shape[-1] == 4
                     and torch.isfinite(b).all() for b in boxes):
            problems.append(f'{name}: boxes not finite or not on {device}')
    rows = [dict(_row(name, built[name], runs[name], memory[name],
                      detectors.shape),
                 boxes_per_image=[len(r.pred_instances.bboxes)
                                  for r in results[name]])
            for name in jobs]
    for row in rows:
        del row['kind']  # not a training row
    detail = _describe(rows, repeats, warmup)
    if problems:
        detail = '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail), rows
