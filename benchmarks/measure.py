"""Measuring instruments of the benchmark: timing, peak memory, the bytes
autograd saves, MACs, the matmul calibration, the interleaved runner and
the scaling fit.

They measure any ``nn.Module`` whose forward takes one NCHW tensor and
returns a tensor or a tuple of tensors.
"""
from __future__ import annotations

import copy
import ctypes
import dataclasses
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch
from torch import nn

MODES = ('fwd', 'fwdbwd')
# the folder holding benchmarks/ (and posmlp_dense/): the git checkout
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg: str, start: Optional[float] = None):
    prefix = '' if start is None else f'[{time.perf_counter() - start:7.1f}s] '
    print(prefix + msg, flush=True)


def fmt(value, spec: str, missing: str = '-') -> str:
    """``format(value, spec)``, or ``missing`` for None."""
    return missing if value is None else format(value, spec)


class PeakMemory:
    """Peak memory increase during a block of code, in bytes (``.peak``).

    CUDA: ``torch.cuda.max_memory_allocated`` (reset at entry) minus the
    memory allocated at entry: the peak of the tensors the call creates.

    CPU: torch keeps no allocator statistics, so the process's resident set
    size (RSS) is used. Before entry, glibc is asked to return freed heap
    memory to the system (``malloc_trim(0)``), so that memory kept from
    earlier calls does not hide this call's allocations. Then, where Linux
    allows it (method ``'hwm'``), the kernel's RSS high-water mark is reset
    (``/proc/self/clear_refs``) and the result is VmHWM at exit minus VmRSS
    at entry: exact, and no extra thread runs during the call. Otherwise
    (method ``'sampler'``) a thread reads /proc/self/statm every
    ``interval`` seconds (this can miss short spikes, and a thread waking
    every millisecond changes how fast a 2-core virtual machine runs). The
    RSS counts everything the process touches meanwhile (allocator overhead,
    library workspaces). ``peak`` is None where /proc is missing.
    """

    _libc = None
    _hwm_ok: Optional[bool] = None

    def __init__(self, device: torch.device, interval: float = 0.001):
        self.device = device
        self.interval = interval
        self.peak: Optional[int] = None
        self.method: Optional[str] = None
        self._stop = threading.Event()
        self._thread = None
        self._page = os.sysconf('SC_PAGE_SIZE') if hasattr(os, 'sysconf') \
            else 4096

    @classmethod
    def trim(cls):
        if cls._libc is None:
            try:
                cls._libc = ctypes.CDLL('libc.so.6')
                cls._libc.malloc_trim.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):
                cls._libc = False
        if cls._libc:
            cls._libc.malloc_trim(0)

    @staticmethod
    def _status_kb(field: str) -> int:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1]) * 1024
        raise OSError(f'no {field} in /proc/self/status')

    @classmethod
    def _reset_hwm(cls) -> bool:
        if cls._hwm_ok is False:
            return False
        try:
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
            if cls._hwm_ok is None:  # check once that the reset works
                cls._hwm_ok = (cls._status_kb('VmHWM')
                               <= cls._status_kb('VmRSS') + (1 << 20))
            return cls._hwm_ok
        except OSError:
            cls._hwm_ok = False
            return False

    def _rss(self) -> int:
        with open('/proc/self/statm', 'rb', buffering=0) as f:
            return int(f.read().split()[1]) * self._page

    def _sample(self):
        while not self._stop.is_set():
            rss = self._rss()
            if rss > self._max:
                self._max = rss
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.device.type == 'cuda':
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
            self.method = 'cuda'
            return self
        if not os.path.exists('/proc/self/statm'):
            return self
        self.trim()
        if self._reset_hwm():
            self.method = 'hwm'
            self._base = self._status_kb('VmRSS')
            return self
        self.method = 'sampler'
        self._base = self._max = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.method == 'cuda':
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - \
                self._base
        elif self.method == 'hwm':
            self.peak = self._status_kb('VmHWM') - self._base
        elif self.method == 'sampler':
            self._stop.set()
            self._thread.join()
            self.peak = max(self._max, self._rss()) - self._base
        return False


MEMORY_METHODS = {
    'cuda': 'torch.cuda.max_memory_allocated during the call minus the '
            'memory allocated before it',
    'hwm': 'increase of the resident set size: kernel high-water mark '
           '(VmHWM, reset through /proc/self/clear_refs before the call) '
           'minus VmRSS before the call, after malloc_trim(0)',
    'sampler': 'increase of the resident set size, sampled from '
               '/proc/self/statm by a thread every {interval} ms, after '
               'malloc_trim(0)',
    None: 'not measured (no /proc)',
}


class SavedActivations:
    """Bytes that autograd keeps for the backward pass, counted while the
    forward runs (``torch.autograd.graph.saved_tensors_hooks``).

    Every saved tensor is charged the whole storage it views, and each
    storage once, however many operations save it (the one a view and its
    base share, an output saved by the next operation as its input). The
    storages of ``exclude`` (the model's parameters and buffers, which
    exist whether or not anything is saved) go to ``excluded_bytes``, the
    rest to ``activation_bytes``. The figure is the same on any device:
    it depends only on which tensors the model's operations save.

    Inside a non-reentrant ``torch.utils.checkpoint`` region the tensors
    are held by the checkpoint, not saved; the region's inputs, which the
    checkpoint keeps, are seen here as saved.
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        self._excluded = {self._key(t) for t in exclude}
        self._storages: Dict[tuple, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(
            self._pack, self._unpack)

    @staticmethod
    def _key(t: torch.Tensor) -> tuple:
        return t.device, t.untyped_storage().data_ptr()

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        self._storages[self._key(t)] = t.untyped_storage().nbytes()
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        return self._hooks.__exit__(*exc)

    @property
    def activation_bytes(self) -> int:
        return sum(n for k, n in self._storages.items()
                   if k not in self._excluded)

    @property
    def excluded_bytes(self) -> int:
        return sum(n for k, n in self._storages.items()
                   if k in self._excluded)


def make_step(model: nn.Module, mode: str) -> Callable[[torch.Tensor], None]:
    """A function running one call of ``model`` on an input batch.

    ``fwd``: forward without autograd. ``fwdbwd`` (a training step of the
    backbone alone): forward, the loss, backward. The loss is the sum of
    the first half of every returned level's channels: a sum of squares
    (or of all channels) of layer-normalized outputs is constant while the
    norms' affine parameters are at their initial values, so its gradient
    would be rounding residue, not a training step's.
    """
    if mode == 'fwd':
        def step(x):
            with torch.no_grad():
                model(x)
    elif mode == 'fwdbwd':
        def step(x):
            outs = model(x)
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            loss = sum(o[:, :o.shape[1] // 2].float().sum() for o in outs)
            loss.backward()
    else:
        raise ValueError(f'unknown mode {mode!r}')
    return step


def set_mode(model: nn.Module, mode: str):
    """eval for ``fwd``, train for ``fwdbwd``; no call when already so
    (PosMLP's ``train()``/``eval()`` drop its cached mixing matrices)."""
    training = mode != 'fwd'
    if any(m.training != training for m in model.modules()):
        model.train(training)
    model.zero_grad(set_to_none=True)


def minor_page_faults() -> Optional[int]:
    """The process's minor page faults so far (None where the OS does not
    count them). On a CPU every fresh page an allocation touches is one:
    glibc's malloc maps large blocks (32 MB and up, and smaller ones until
    it has freed one that size) straight from the OS and returns them on
    free, so a model whose temporaries are large pays for faulting them in
    at every call, and how much depends on what the process did before."""
    if sys.platform == 'win32':
        return None
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed_call(step: Callable[[], object], device: torch.device
               ) -> Tuple[float, Optional[int]]:
    """(seconds, minor page faults) of one call of ``step()``."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    faults = minor_page_faults()
    t0 = time.perf_counter()
    step()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    if faults is not None:
        faults = minor_page_faults() - faults
    return elapsed, faults


def peak_of_call(step: Callable[[], object], device: torch.device,
                 mem_interval: float) -> Optional[int]:
    """Peak memory growth (bytes) of one call of ``step()``: PeakMemory."""
    with PeakMemory(device, mem_interval) as mem:
        step()
    return mem.peak


def count_macs(model: nn.Module, size: Tuple[int, int], mode: str,
               device: torch.device, fake: bool = True
               ) -> Tuple[int, Dict[str, int], str]:
    """Multiply-adds of one call at batch 1 (FLOPs / 2), FLOPs per operator,
    and how they were counted.

    A call before the counted one fills the models' caches (window plans,
    mixing matrices in eval mode), so the count is that of a repeated call,
    as timed. With ``fake`` the calls run on a copy of the model under
    torch's FakeTensorMode (shapes only, no arithmetic: seconds instead of
    two real passes); if that fails, the real model runs.
    """
    from torch.utils.flop_counter import FlopCounterMode

    def count(net, x):
        set_mode(net, mode)
        step = make_step(net, mode)
        step(x)
        net.zero_grad(set_to_none=True)
        counter = FlopCounterMode(display=False)
        with counter:
            step(x)
        set_mode(net, 'fwd')
        by_op = {str(k): int(v) for k, v in
                 counter.get_flop_counts().get('Global', {}).items()}
        return counter.get_total_flops() // 2, by_op

    if fake:
        try:
            from torch._subclasses.fake_tensor import FakeTensorMode
            twin = copy.deepcopy(model)  # fake tensors end up in its caches
            with warnings.catch_warnings(), \
                    FakeTensorMode(allow_non_fake_inputs=True):
                warnings.simplefilter('ignore')
                x = torch.empty(1, 3, *size, device=device)
                total, by_op = count(twin, x)
            return total, by_op, 'fake'
        except Exception as exc:  # noqa: BLE001  (fall back to real runs)
            log(f'counting on fake tensors failed ({type(exc).__name__}: '
                f'{exc}); counting with real tensors')
        finally:
            set_mode(model, 'fwd')
    total, by_op = count(model, make_input(size, 1, device, 0))
    return total, by_op, 'real'


def matmul_calibration(device: torch.device, n: int, repeats: int = 5
                       ) -> dict:
    """GFLOP/s of an n x n x n fp32 torch.mm (median of ``repeats``)."""
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    times = []
    for i in range(repeats + 1):
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        if i:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return dict(n=n, seconds=times, median_s=med,
                gflops=2 * n ** 3 / med / 1e9)



def size_name(size: Tuple[int, int]) -> str:
    return f'{size[0]}x{size[1]}'



def make_input(size: Tuple[int, int], batch: int, device: torch.device,
               seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(
        seed + 1000 * batch + size[0] + size[1])
    return torch.randn(batch, 3, *size, generator=gen).to(device)


@dataclasses.dataclass
class Job:
    """One thing to time: ``step()`` runs it once; ``reset()`` runs after
    every call, untimed (e.g. to drop the gradients)."""
    key: tuple
    name: str
    step: Callable[[], object]
    reset: Callable[[], object] = lambda: None


def run_jobs(jobs: Sequence[Job], repeats: int, warmup: int,
             device: torch.device, mem_interval: float,
             label: Callable[[tuple], str], start: float,
             measure_peak: bool = True) -> Dict[tuple, dict]:
    """Time ``jobs`` in interleaved rounds.

    First ``warmup`` untimed rounds, then ``repeats`` timed rounds; every
    round runs every job once, and the order of the jobs rotates from round
    to round, so that a drift of the machine's speed is shared by all.

    With ``measure_peak``, one more call per job measures its peak memory
    (``peaks``). It is kept out of the timed calls: on a CPU, PeakMemory
    first has glibc return all freed memory to the OS, and a timed call
    after that pays for faulting its whole working set in again, which the
    steady state of a training or inference loop does not.
    """
    runs = {job.key: dict(times=[], faults=[], peaks=[], warmup_times=[],
                          warmup_faults=[]) for job in jobs}
    jobs = list(jobs)
    for r in range(warmup + repeats):
        timed = r >= warmup
        k = (r - warmup) % len(jobs) if timed else 0
        for job in jobs[k:] + jobs[:k]:
            t, faults = timed_call(job.step, device)
            job.reset()
            entry = runs[job.key]
            prefix = '' if timed else 'warmup_'
            entry[prefix + 'times'].append(t)
            entry[prefix + 'faults'].append(faults)
            which = (f'round {r - warmup + 1}/{repeats}' if timed
                     else f'warm-up {r + 1}/{warmup}')
            log(f'{label(job.key)}  {which}  {job.name:<15s} '
                f'{t * 1e3:9.1f} ms  {fmt(faults, "d")} page faults', start)
    if measure_peak:
        for job in jobs:
            runs[job.key]['peaks'].append(
                peak_of_call(job.step, device, mem_interval))
            job.reset()
    return runs


def model_job(key: tuple, name: str, model: nn.Module, x: torch.Tensor,
              mode: str) -> Job:
    """A job calling ``model`` on ``x`` in ``mode`` (see ``make_step``);
    the model must already be in that mode (``set_mode``)."""
    step = make_step(model, mode)
    return Job(key, name, lambda: step(x),
               lambda: model.zero_grad(set_to_none=True))


def run_interleaved(models: Dict[str, nn.Module],
                    jobs: Sequence[Tuple[tuple, str, torch.Tensor]],
                    mode: str, repeats: int, warmup: int,
                    device: torch.device, mem_interval: float,
                    label: Callable[[tuple], str], start: float,
                    measure_peak: bool = True) -> Dict[tuple, dict]:
    """``run_jobs`` for jobs = [(key, model name, input)], all in ``mode``;
    the models are back in eval mode afterwards."""
    names = list(dict.fromkeys(name for _, name, _ in jobs))
    try:
        for name in names:
            set_mode(models[name], mode)
        return run_jobs(
            [model_job(key, name, models[name], x, mode)
             for key, name, x in jobs],
            repeats, warmup, device, mem_interval, label, start,
            measure_peak)
    finally:
        for name in names:
            set_mode(models[name], 'fwd')


def summarize(runs: dict, batch: int, macs: Optional[int]) -> dict:
    """Median latency, images/s, peak memory and achieved GFLOP/s (the
    fraction of the matmul calibration is added at the end of the run)."""
    times = runs['times']
    med = statistics.median(times)
    peaks = [p for p in runs['peaks'] if p is not None]
    out = dict(runs)
    out.update(median_s=med, min_s=min(times), max_s=max(times),
               images_per_s=batch / med,
               peak_mem_mb=(max(peaks) / 2 ** 20) if peaks else None,
               page_faults=median_faults(runs.get('faults', [])))
    if macs is not None:
        flops = 2 * macs * batch
        out.update(gmacs_per_image=macs / 1e9,
                   gflops_per_s=flops / med / 1e9)
    return out


def median_faults(faults: Sequence[Optional[int]]) -> Optional[int]:
    """The median of the counted page faults per call (None if uncounted)."""
    counted = [f for f in faults if f is not None]
    return int(statistics.median(counted)) if counted else None


def fit_exponent(pixels: Sequence[float], seconds: Sequence[float]) -> dict:
    """Least-squares fit of log(seconds) = a + exponent * log(pixels)."""
    xs = [math.log(p) for p in pixels]
    ys = [math.log(s) for s in seconds]
    n = len(xs)
    if n < 2:
        return dict(exponent=None, r2=None)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    slope = sxy / sxx
    ss_res = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return dict(exponent=slope, r2=1 - ss_res / ss_tot if ss_tot else 1.0)



def loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


# Settings that change how the C library's malloc hands memory back to the
# OS (or replace malloc), and so how many page faults each step takes on a
# CPU: a run under one is not comparable with a run under the default.
ALLOCATOR_SETTINGS = ('GLIBC_TUNABLES', 'MALLOC_MMAP_THRESHOLD_',
                      'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_MAX_',
                      'MALLOC_TOP_PAD_', 'LD_PRELOAD')


def allocator_settings() -> Dict[str, str]:
    """The ALLOCATOR_SETTINGS variables set in this process's environment."""
    return {name: os.environ[name] for name in ALLOCATOR_SETTINGS
            if os.environ.get(name)}


# glibc tunables under which malloc keeps freed memory in the process: no
# block is ever handed back to the OS (mmap only above 4 GiB, trimming only
# above 64 GiB), so a step reuses its predecessor's pages and takes no page
# faults, as a GPU's caching allocator reuses its blocks. Read by glibc when
# a process starts, so they apply to a new process only.
KEEP_FREED_MEMORY = ('glibc.malloc.mmap_threshold=4294967296',
                     'glibc.malloc.trim_threshold=68719476736')


def keeps_freed_memory() -> bool:
    """Whether this process was started with KEEP_FREED_MEMORY."""
    current = os.environ.get('GLIBC_TUNABLES', '').split(':')
    return all(t in current for t in KEEP_FREED_MEMORY)


def environment_keeping_freed_memory() -> Dict[str, str]:
    """This process's environment with KEEP_FREED_MEMORY added to
    GLIBC_TUNABLES (other tunables kept), for a child process. Raises where
    the C library is not glibc, which would ignore them."""
    if platform.libc_ver()[0] != 'glibc':
        raise RuntimeError(
            'keeping freed memory needs glibc\'s malloc (Linux); this '
            f'Python runs on {platform.libc_ver()[0] or "another C library"}')
    env = dict(os.environ)
    current = [t for t in env.get('GLIBC_TUNABLES', '').split(':') if t]
    names = {t.split('=')[0] for t in KEEP_FREED_MEMORY}
    kept = [t for t in current if t.split('=')[0] not in names]
    env['GLIBC_TUNABLES'] = ':'.join(kept + list(KEEP_FREED_MEMORY))
    return env


def environment(device: torch.device) -> dict:
    env = dict(
        time=datetime.datetime.now().isoformat(timespec='seconds'),
        python=platform.python_version(), platform=platform.platform(),
        torch=torch.__version__, threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        cpu_count=os.cpu_count(), device=str(device),
        mkldnn=torch.backends.mkldnn.is_available(),
        allocator=allocator_settings())
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    env['cpu_model'] = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        env['loadavg_start'] = os.getloadavg()
    except OSError:
        pass
    for mod in ('mmdet', 'mmcv', 'mmengine', 'timm', 'posmlp_dense'):
        try:
            env[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001  (report what is there)
            pass
    if device.type == 'cuda':
        env['cuda_device'] = torch.cuda.get_device_name(device)
        env['cuda'] = torch.version.cuda
        env['cudnn'] = torch.backends.cudnn.version()
    try:
        env['git_commit'] = subprocess.run(
            ['git', 'rev-parse', 'HEAD'], cwd=SOURCE_ROOT, capture_output=True,
            text=True, timeout=10).stdout.strip()
        env['git_dirty_files'] = [
            line[3:] for line in subprocess.run(
                ['git', 'status', '--porcelain', '--untracked-files=no'],
                cwd=SOURCE_ROOT, capture_output=True, text=True,
                timeout=10).stdout.splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass
    return env

