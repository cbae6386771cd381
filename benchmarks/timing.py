"""The one timing function of the kit, and peak memory.

Every tool times through ``interleaved``: the jobs run round by round,
each round starting one job further, so that a drift of the machine's
speed (other processes, clock changes) is shared by all of them. On CUDA a
call is timed by two events on the GPU's clock; on a CPU by the wall
clock.
"""
from __future__ import annotations

import ctypes
import statistics
import time
from typing import Callable, Dict, Optional

import torch

MB = 2 ** 20


def _timed_call(step: Callable[[], object], device: torch.device) -> float:
    if device.type != 'cuda':
        start = time.perf_counter()
        step()
        return time.perf_counter() - start
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)  # the events time this call alone
    begin.record()
    step()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def interleaved(jobs: Dict[str, Callable[[], object]], repeats: int,
                warmup: int = 0, device: torch.device = torch.device('cpu'),
                reset: Optional[Dict[str, Callable[[], object]]] = None,
                log: Optional[Callable[[str], None]] = None
                ) -> Dict[str, dict]:
    """``warmup`` untimed, then ``repeats`` timed rounds of ``jobs``;
    ``reset[name]`` runs untimed after each call of that job. Returns per
    job its ``times``, ``warmup_times``, ``median_s``, ``min_s`` and
    ``max_s``."""
    names = list(jobs)
    runs = {n: dict(times=[], warmup_times=[]) for n in names}
    reset = reset or {}
    for r in range(warmup + repeats):
        timed = r >= warmup
        k = (r - warmup) % len(names) if timed else 0
        for name in names[k:] + names[:k]:
            seconds = _timed_call(jobs[name], device)
            if name in reset:
                reset[name]()
            runs[name]['times' if timed else 'warmup_times'].append(seconds)
            if log:
                which = f'round {r - warmup + 1}' if timed else 'warm-up'
                log(f'{which:<9s} {name:<28s} {seconds * 1e3:10.1f} ms')
    for run in runs.values():
        times = run['times']
        run.update(median_s=statistics.median(times), min_s=min(times),
                   max_s=max(times))
    return runs


MEMORY_METHODS = {
    'cuda': 'torch.cuda.max_memory_allocated during the call minus the '
            'memory allocated before it',
    'hwm': 'the resident set\'s high-water mark (VmHWM, reset through '
           '/proc/self/clear_refs after malloc_trim(0)) minus VmRSS before '
           'the call',
    None: 'not measured',
}


def _status_bytes(field: str) -> int:
    with open('/proc/self/status') as f:
        line = next(line for line in f if line.startswith(field + ':'))
    return int(line.split()[1]) * 1024


class PeakMemory:
    """Peak memory growth of a block in bytes (``.peak``; None where it
    cannot be measured) and on CUDA ``.allocated``, the allocator's peak
    itself; ``.method`` names how (``MEMORY_METHODS``). Never around a
    timed call: on a CPU it first hands freed memory back to the OS (so
    that memory kept from earlier calls hides nothing), which the next
    call pays for in page faults."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = self.allocated = self.method = None

    def __enter__(self):
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self.method = 'cuda'
            return self
        try:
            ctypes.CDLL('libc.so.6').malloc_trim(ctypes.c_size_t(0))
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')  # resets VmHWM to VmRSS
            self._base = _status_bytes('VmRSS')
            if _status_bytes('VmHWM') <= self._base + MB:
                self.method = 'hwm'
        except (OSError, AttributeError, StopIteration):
            pass  # not Linux with glibc: not measured
        return self

    def __exit__(self, *exc):
        if self.method == 'cuda':
            torch.cuda.synchronize(self.device)
            self.allocated = torch.cuda.max_memory_allocated(self.device)
            self.peak = self.allocated - self._base
        elif self.method == 'hwm':
            self.peak = _status_bytes('VmHWM') - self._base
        return False


def peak_memory(step: Callable[[], object], device: torch.device
                ) -> PeakMemory:
    """``PeakMemory`` of one call of ``step``."""
    with PeakMemory(device) as mem:
        step()
    return mem
