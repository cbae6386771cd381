"""Tier 2, the OpenMMLab stack (optional): a RetinaNet-PosMLP-T training
iteration and an mmdet predict, timed beside RetinaNet-Swin-T's.

The detectors are the benchmark's (``bench.training``: mmdet's
RetinaNet-Swin-T config, and the same with PosMLP-T as its backbone).
Where mmengine, mmcv or mmdet cannot be imported, or mmcv's compiled ops
lack CUDA, both checks are skipped and say why.
"""
from __future__ import annotations

import copy
from typing import Callable, Dict, List, Optional, Tuple

import torch

from posmlp_dense.optional_deps import is_installed
from .rows import Skip, Verdict
from .timing import MB, interleaved, ms, peak_memory

MM_PACKAGES = ('mmengine', 'mmcv', 'mmdet')
BACKBONES = ('posmlp_t', 'swin_t')


def require_openmmlab(device: torch.device):
    """Raise Skip naming what is missing for the detector checks."""
    missing = [name for name in MM_PACKAGES if not is_installed(name)]
    if missing:
        raise Skip(f'{", ".join(missing)} not importable here (tier 2 needs '
                   f'the OpenMMLab stack with mmcv\'s compiled ops; see '
                   f'docs/gpu.md)')
    try:
        from mmcv.ops import get_compiling_cuda_version
    except ImportError as err:
        raise Skip(f"mmcv's compiled ops are not importable: {err}") from err
    version = get_compiling_cuda_version()
    if device.type == 'cuda' and version in ('', 'not available'):
        raise Skip(f"mmcv's ops were built without CUDA "
                   f"(get_compiling_cuda_version() = {version!r})")


class Detectors:
    """The two RetinaNets and their batch, built on first use (by the first
    check that needs them); a failure to build is raised to each check."""

    def __init__(self, arch, shape: Tuple[int, int, int],
                 device: torch.device, seed: int):
        self.arch, self.shape = arch, shape
        self.device, self.seed = device, seed
        self._built: Optional[dict] = None
        self._error: Optional[BaseException] = None

    def get(self) -> dict:
        if self._error is not None:
            raise self._error
        if self._built is None:
            try:
                self._built = self._build()
            except BaseException as err:
                self._error = err
                raise
        return self._built

    def _build(self) -> dict:
        require_openmmlab(self.device)
        from ..training import (DETECTOR_LABELS, TrainingCase,
                                      detection_batch, training_job)
        posmlp_arch = None if self.arch == 't' else dict(self.arch)
        built = dict(jobs={}, models={}, labels={}, cases={})
        for name in BACKBONES:
            case = TrainingCase('detector', name, False, tuple(self.shape))
            job, model = training_job(case, self.device, self.seed,
                                      posmlp_arch)
            built['jobs'][name] = job.step
            built['models'][name] = model
            built['labels'][name] = DETECTOR_LABELS[name]
            built['cases'][name] = case
        built['data'] = detection_batch(self.shape, self.seed)
        return built


def train_iteration(detectors: Detectors, warmup: int, repeats: int
                    ) -> Tuple[Verdict, List[dict]]:
    """``model.train_step`` (preprocessing, forward, RetinaNet losses,
    backward, AdamW) of both detectors, interleaved; benchmark rows of
    kind 'detector'."""
    built = detectors.get()
    device = detectors.device
    runs = interleaved(built['jobs'], warmup, repeats, device)
    rows = []
    for name, step in built['jobs'].items():
        peak, growth = peak_memory(step, device)
        model, run = built['models'][name], runs[name]
        rows.append(dict(
            built['cases'][name].as_dict(), label=built['labels'][name],
            times=run['times'], warmup_times=run['warmup_times'],
            median_s=run['median_s'], min_s=run['min_s'],
            max_s=run['max_s'],
            images_per_s=detectors.shape[0] / run['median_s'],
            page_faults=None, params=_params(model),
            backbone_params=_params(model.backbone), memory='inprocess',
            peak_method='cuda' if peak is not None else None,
            peak_mb=None if growth is None else growth / MB,
            peak_first_step_mb=None,
            max_memory_allocated_mb=None if peak is None else peak / MB))
    return Verdict(True, _describe(rows, repeats, warmup)), rows


def predict(detectors: Detectors, warmup: int, repeats: int
            ) -> Tuple[Verdict, List[dict]]:
    """``model.test_step`` (preprocessing, forward, box decoding, NMS) of
    both detectors in eval mode; every image gets finite boxes on the
    device."""
    built = detectors.get()
    device, batch = detectors.device, detectors.shape[0]
    results: Dict[str, list] = {}

    def job(name) -> Callable[[], None]:
        model = built['models'][name]

        def run():
            with torch.no_grad():
                results[name] = model.test_step(copy.deepcopy(built['data']))
        return run

    for model in built['models'].values():
        model.eval()
    try:
        jobs = {name: job(name) for name in built['models']}
        runs = interleaved(jobs, warmup, repeats, device)
        peaks = {name: peak_memory(jobs[name], device) for name in jobs}
    finally:
        for model in built['models'].values():
            model.train()
    problems = []
    for name, out in results.items():
        boxes = [r.pred_instances.bboxes for r in out]
        if len(out) != batch:
            problems.append(f'{name}: {len(out)} results for {batch} images')
        elif not all(b.device.type == device.type and b.shape[-1] == 4
                     and torch.isfinite(b).all() for b in boxes):
            problems.append(f'{name}: boxes not finite or not on {device}')
    rows = [dict(model=name, label=built['labels'][name],
                 shape=list(detectors.shape), times=runs[name]['times'],
                 median_s=runs[name]['median_s'], min_s=runs[name]['min_s'],
                 max_memory_allocated_mb=None if peaks[name][0] is None
                 else peaks[name][0] / MB,
                 boxes_per_image=[len(r.pred_instances.bboxes)
                                  for r in results[name]])
            for name in jobs]
    detail = _describe(rows, repeats, warmup)
    if problems:
        detail = '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail), rows


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _describe(rows: List[dict], repeats: int, warmup: int) -> str:
    ours, swin = rows
    parts = []
    for row in rows:
        mb = row['max_memory_allocated_mb']
        parts.append(f"{row['label']} {ms(row['median_s'])}"
                     + ('' if mb is None else
                        f', max_memory_allocated {mb:.0f} MB'))
    return (f'median of {repeats} after {warmup} warm-up: '
            + ' | '.join(parts) + f" | time ratio "
            f"{ours['median_s'] / swin['median_s']:.2f}")
