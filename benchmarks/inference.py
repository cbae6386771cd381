"""Inference cost of the backbones: latency, memory and MACs per input size,
and how forward latency grows with the input size."""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .measure import (count_macs, fit_exponent, fmt, loadavg, log,
                      make_input, matmul_calibration, run_interleaved,
                      size_name, summarize)
from .models import count_params

Size = Tuple[int, int]


class MacCounter:
    """MACs per (model, size, mode), each counted once (see
    ``count_macs``); ``table`` keeps them for the report."""

    def __init__(self, models: Dict[str, nn.Module], device: torch.device,
                 fake: bool = True, start: float = 0.0):
        self.models, self.device, self.fake = models, device, fake
        self.start = start
        self.table: Dict[str, dict] = {}
        self._totals: Dict[tuple, int] = {}

    def __call__(self, name: str, size: Size, mode: str) -> int:
        key = (name, size, mode)
        if key not in self._totals:
            total, by_op, how = count_macs(self.models[name], size, mode,
                                           self.device, fake=self.fake)
            self._totals[key] = total
            self.table.setdefault(name, {}).setdefault(mode, {})[
                size_name(size)] = dict(gmacs=total / 1e9, flops_by_op=by_op,
                                        counted_on=how)
            log(f'counted {name} {size_name(size)} {mode}: '
                f'{total / 1e9:.2f} GMACs', self.start)
        return self._totals[key]


def run_settings(models: Dict[str, nn.Module],
                 settings: Sequence[Tuple[str, Sequence[str],
                                          Sequence[Size]]],
                 batches: Sequence[int], repeats: int, warmup: int,
                 warmup_each: bool, device: torch.device, mem_interval: float,
                 calib_n: int, seed: int,
                 macs_of: Optional[Callable[[str, Size, str], int]] = None,
                 start: float = 0.0) -> Tuple[List[dict], List[dict]]:
    """Rows for every (mode, model names, sizes) in ``settings`` and every
    batch, the models of a setting interleaved; also the matmul
    calibrations taken before each setting."""
    results, calibs = [], []
    for mode, names, sizes in settings:
        if not names:
            continue
        for size in sizes:
            for bi, batch in enumerate(batches):
                x = make_input(size, batch, device, seed)
                macs = {n: macs_of(n, size, mode) if macs_of else None
                        for n in names}
                what = f'{mode:<6s} {size_name(size):>9s} b{batch}'
                local = matmul_calibration(device, calib_n, repeats=2)
                calibs.append(local)
                runs = run_interleaved(
                    models, [((n,), n, x) for n in names], mode, repeats,
                    warmup if bi == 0 or warmup_each else 0, device,
                    mem_interval, lambda key: what, start)
                state = dict(calib_gflops_before=local['gflops'],
                             loadavg=loadavg())
                for n in names:
                    r = summarize(runs[(n,)], batch, macs[n])
                    r.update(model=n, size=list(size), batch=batch, mode=mode,
                             params=count_params(models[n]),
                             **state)
                    results.append(r)
                    log(f'{what}  {n:<15s} median {r["median_s"] * 1e3:9.1f}'
                        f' ms  {r["images_per_s"]:7.2f} img/s  peak '
                        f'{fmt(r["peak_mem_mb"], ".0f")} MB  '
                        f'{fmt(r["page_faults"], "d")} page faults', start)
                del x
    return results, calibs


def run_scaling(models: Dict[str, nn.Module], names: Sequence[str],
                sizes: Sequence[Size], repeats: int, warmup: int,
                device: torch.device, mem_interval: float, seed: int,
                start: float = 0.0) -> Dict[str, dict]:
    """Forward latency at batch 1 over ``sizes`` and the fitted exponent
    of latency ~ pixels ** k, per model.

    One set of rounds covers every (size, model): a drift of the machine's
    speed during the sweep does not bend the curve.
    """
    inputs = {s: make_input(s, 1, device, seed) for s in sizes}
    jobs = [((s, n), n, inputs[s]) for s in sizes for n in names]
    runs = run_interleaved(
        models, jobs, 'fwd', repeats, warmup, device, mem_interval,
        lambda key: f'scaling {size_name(key[0]):>9s} b1', start,
        measure_peak=False)
    out = {}
    pixels = [h * w for h, w in sizes]
    for n in names:
        times = [runs[(s, n)]['times'] for s in sizes]
        med = [statistics.median(t) for t in times]
        fastest = [min(t) for t in times]
        fit = fit_exponent(pixels, med)
        fit_min = fit_exponent(pixels, fastest)
        out[n] = dict(sizes=[list(s) for s in sizes], pixels=pixels,
                      median_s=med, min_s=fastest, times=times,
                      exponent_min=fit_min['exponent'], r2_min=fit_min['r2'],
                      **fit)
        log(f'scaling {n}: latency ~ pixels^{fmt(fit["exponent"], ".3f")}'
            f' (R^2 {fmt(fit["r2"], ".3f")})', start)
    return out
