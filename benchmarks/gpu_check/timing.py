"""Timing with CUDA events (wall clock on a CPU), interleaved rounds,
medians, and CUDA peak memory."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Optional, Tuple

import torch

MB = 2 ** 20


def timed(step: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``step``.

    CUDA: the time between two events recorded around the call, on the
    GPU's own clock (the queue is empty at the start: the previous call
    ended with a synchronization). CPU: wall clock.
    """
    if device.type != 'cuda':
        start = time.perf_counter()
        step()
        return time.perf_counter() - start
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    begin.record()
    step()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def interleaved(jobs: Dict[str, Callable[[], object]], warmup: int,
                repeats: int, device: torch.device,
                reset: Optional[Dict[str, Callable[[], object]]] = None
                ) -> Dict[str, dict]:
    """``warmup`` untimed and ``repeats`` timed rounds; every round runs
    every job once, starting one job further each round, so that a drift
    of the machine's speed is shared by all. ``reset[name]`` runs after
    each call of that job, untimed."""
    names = list(jobs)
    runs = {n: dict(times=[], warmup_times=[]) for n in names}
    reset = reset or {}
    for r in range(warmup + repeats):
        timed_round = r >= warmup
        k = (r - warmup) % len(names) if timed_round else 0
        for name in names[k:] + names[:k]:
            t = timed(jobs[name], device)
            if name in reset:
                reset[name]()
            runs[name]['times' if timed_round else 'warmup_times'].append(t)
    for run in runs.values():
        times = run['times']
        run.update(median_s=statistics.median(times), min_s=min(times),
                   max_s=max(times))
    return runs


def peak_memory(step: Callable[[], object], device: torch.device
                ) -> Tuple[Optional[int], Optional[int]]:
    """(torch.cuda.max_memory_allocated during one call of ``step``, that
    minus the memory allocated before it), in bytes; (None, None) off
    CUDA."""
    if device.type != 'cuda':
        step()
        return None, None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return peak, peak - before


def ms(seconds: Optional[float]) -> str:
    return '-' if seconds is None else f'{seconds * 1e3:.1f} ms'


def mib(value: Optional[float]) -> str:
    """'max_memory_allocated N MB' for a byte count; None: not measured."""
    return ('memory not measured' if value is None
            else f'max_memory_allocated {value / MB:.0f} MB')

