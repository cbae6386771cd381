#!/usr/bin/env python
"""Speed, memory and cost of PosMLP backbones against Swin and ResNet-50.

All models run in one process, on the same input tensors, and their timed
runs are interleaved round by round, so that a machine whose speed drifts
(other jobs, clock changes) affects every model alike. Measured for every
(input size, batch, mode):

* median (and fastest) latency of a backbone forward (``fwd``: eval mode, no autograd) or
  forward + backward (``fwdbwd``: train mode, gradient of the mean of every
  output level), and images per second;
* peak memory of the call (see ``PeakMemory`` for how);
* parameters, and multiply-adds counted by ``torch.utils.flop_counter``
  (MACs = counted FLOPs / 2; it counts mm, addmm, bmm, baddbmm and
  convolutions, and einsum / matmul / ``@`` run as those, so the token
  mixing and Swin's attention matmuls are included);
* achieved GFLOP/s, also as a fraction of a large fp32 matmul timed in the
  same run (the calibration).

Models: ``posmlp_t``/``posmlp_s`` (this package), ``swin_t``/``swin_s`` and
``resnet50`` (built from mmdet's registry), and ``published_port``: the
PosMLP-T weights run the way the published code runs them (see
``PublishedPort``), the baseline the mixing is compared with.

A second part measures how forward latency grows with the input size
(square inputs, batch 1) and fits latency ~ pixels ** exponent.

Writes ``benchmark.json`` (every raw number and the environment),
``benchmark.png`` (chart) and ``benchmark.md`` (tables for the README).

Examples::

    python tools/benchmark.py                 # the full default run
    python tools/benchmark.py --quick         # a few minutes
    python tools/benchmark.py --sizes 800x1333 --batches 1 --modes fwd \\
        --models posmlp_t,swin_t,published_port --repeats 5

The benchmark changes no process-wide numeric setting (no flushing of
subnormal floats, no TF32 switches, torch's default thread count).
"""
from __future__ import annotations

import argparse
import copy
import ctypes
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import threading
import time
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ALL_MODELS = ('posmlp_t', 'posmlp_s', 'swin_t', 'swin_s', 'resnet50',
              'published_port')
LABELS = {
    'posmlp_t': 'PosMLP-T', 'posmlp_s': 'PosMLP-S', 'swin_t': 'Swin-T',
    'swin_s': 'Swin-S', 'resnet50': 'ResNet-50',
    'published_port': 'PosMLP-T published port',
}
MODES = ('fwd', 'fwdbwd')

# Defaults: the full run takes about 11 minutes on an idle 2-core CPU (and
# two to five times as long while other jobs run); --quick is a subset of
# a few minutes. fwdbwd stops at 512x512: at 800x1333 a backward of
# PosMLP-S at batch 2 would need roughly 10 GB, extrapolated from 512x512
# (--fwdbwd-max-pixels 0 runs it anyway).
DEFAULTS = dict(
    models=','.join(ALL_MODELS), sizes='224,512,800x1333', batches='1,2',
    modes='fwd,fwdbwd', fwdbwd_models='posmlp_t,posmlp_s,swin_t,swin_s,'
    'resnet50', fwdbwd_max_pixels=512 * 512, repeats=5, warmup=1,
    scaling_sizes='512,800,1024,1333,1600', scaling_models='posmlp_t,swin_t',
    scaling_repeats=3)
QUICK = dict(
    models='posmlp_t,swin_t,resnet50,published_port', sizes='224,800x1333',
    batches='1', modes='fwd,fwdbwd', fwdbwd_models='posmlp_t,swin_t',
    fwdbwd_max_pixels=224 * 224, repeats=2, warmup=1, scaling_sizes='512,1024',
    scaling_models='posmlp_t,swin_t', scaling_repeats=2)


def log(msg: str, start: Optional[float] = None):
    prefix = '' if start is None else f'[{time.perf_counter() - start:7.1f}s] '
    print(prefix + msg, flush=True)


# =================================================================== models
class PublishedPort(nn.Module):
    """A PosMLP run the way the published code runs it (speed baseline).

    Uses the parameters of ``model`` (shared, not copied) but none of its
    stem, window or mixing code. Per level, the whole map is cut into w x w
    windows once (a map that windows do not tile is zero-padded to whole
    windows, without masking: fine for timing, not for accuracy, and
    cropped at the end of the level). In every block:

        u, v = GELU(proj_c_e(norm(x))).chunk(2)
        u (b, w, n, v*s) -> (b, w, n, v, s)
        posmap (1, m, n, s) = softmax over n of the encoding's scores,
                              recomputed every forward as published
        out = einsum('wmns,bwnvs->bwmvs', posmap, u) + bias  -> (b, w, n, C)
        x = x + proj_c_s(out * v)

    Tiny softmax weights are not zeroed: the published code keeps them,
    including the subnormal ones.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    @staticmethod
    def posmap(pos) -> torch.Tensor:
        """(1, m, n, s) mixing weights of a whole window."""
        if hasattr(pos, 'score_coefficients'):  # GQPE
            scores = torch.einsum('mnf,sf->mns', pos.rel_indices,
                                  pos.score_coefficients())
            return scores.unsqueeze(0).softmax(dim=-2)
        if hasattr(pos, 'window_relative_position_bias_table'):  # LRPE
            index = pos.window_relative_position_index
            n = index.shape[0]
            table = pos.window_relative_position_bias_table
            return table[index.reshape(-1)].view(1, n, n, -1)
        raise TypeError(f'no published computation for {type(pos).__name__}')

    @staticmethod
    def block(block, win: torch.Tensor) -> torch.Tensor:
        """One block on windows (b, w, n, C)."""
        gate = block.gate_unit
        if not hasattr(gate, 'pos') or not getattr(gate, 'pos_only', True):
            raise TypeError('the published port covers PoSGU gates with '
                            'pos_only=True')
        pos = gate.pos
        b, nw, n, _ = win.shape
        hidden = block.act(block.proj_c_e(block.norm(win)))
        u, v = hidden.chunk(2, dim=-1)
        groups = pos.groups
        u5 = u.reshape(b, nw, n, -1, groups)
        mixed = torch.einsum('wmns,bwnvs->bwmvs', PublishedPort.posmap(pos),
                             u5)
        mixed = mixed + pos.token_proj_n_bias.view(1, 1, n, 1, 1)
        out = block.proj_c_s(mixed.reshape(b, nw, n, -1) * v)
        if block.training and block.drop_path > 0:
            keep = 1.0 - block.drop_path
            out = out * win.new_empty(b, 1, 1, 1).bernoulli_(keep).div_(keep)
        return win + out

    def level(self, level, x: torch.Tensor) -> torch.Tensor:
        """NCHW in, channels-last (B, H, W, C) out."""
        if getattr(level, 'shift', False):
            raise TypeError('the published port covers unshifted windows '
                            'only (shift=False, as published)')
        x = level.pool(x) if hasattr(level, 'pool') else x.permute(0, 2, 3, 1)
        B, H, W, C = x.shape
        wh, ww = level.window
        Hp, Wp = -(-H // wh) * wh, -(-W // ww) * ww
        if (Hp, Wp) != (H, W):
            x = F.pad(x, (0, 0, 0, Wp - W, 0, Hp - H))
        win = x.reshape(B, Hp // wh, wh, Wp // ww, ww, C).permute(
            0, 1, 3, 2, 4, 5).reshape(B, -1, wh * ww, C)
        for block in level.encoder:
            win = self.block(block, win)
        x = win.reshape(B, Hp // wh, Wp // ww, wh, ww, C).permute(
            0, 1, 3, 2, 4, 5).reshape(B, Hp, Wp, C)
        return x[:, :H, :W]

    @staticmethod
    def stem(stem, x: torch.Tensor) -> torch.Tensor:
        """The published stem: conv -> BN -> GELU twice, then conv -> BN,
        on NCHW maps, out of place (not the model's own inference path)."""
        for i, (proj, norm) in enumerate(zip(stem.projs, stem.norms)):
            x = norm(proj(x))
            if i < 2:
                x = stem.act(x)
        return x

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        m = self.model
        x = self.stem(m.patch_embed, x)
        if getattr(m, 'absolute_pos_embed', None) is not None:
            x = x + m.position_embedding(x.shape[-2:])
        maps = []
        for level in m.levels:
            y = self.level(level, x)
            maps.append(y)
            x = y.permute(0, 3, 1, 2)
        outs = []
        for i in m.out_indices:
            y = maps[i]
            if m.out_norm:
                y = getattr(m, f'norm{i}')(y)
            outs.append(y.permute(0, 3, 1, 2).contiguous())
        return tuple(outs)


def _mm_model(cfg: dict) -> nn.Module:
    from mmengine.registry import init_default_scope
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    init_default_scope('mmdet')
    return MODELS.build(cfg)


def _swin(depths: Sequence[int]) -> nn.Module:
    return _mm_model(dict(
        type='SwinTransformer', embed_dims=96, depths=list(depths),
        num_heads=[3, 6, 12, 24], window_size=7, mlp_ratio=4, qkv_bias=True,
        drop_path_rate=0.2, patch_norm=True, out_indices=(0, 1, 2, 3),
        convert_weights=False))


def _resnet50() -> nn.Module:
    return _mm_model(dict(
        type='ResNet', depth=50, num_stages=4, out_indices=(0, 1, 2, 3),
        frozen_stages=-1, norm_cfg=dict(type='BN'), norm_eval=False,
        style='pytorch'))


def build_models(names: Sequence[str], posmlp_arch=None,
                 seed: int = 0) -> Dict[str, nn.Module]:
    """Build the requested models (random initialization, fixed seed).

    ``posmlp_arch`` (a dict) replaces the arch of ``posmlp_t`` and of the
    published port; the port always shares the weights of ``posmlp_t``.
    """
    from posmlp_dense import PosMLP
    models: Dict[str, nn.Module] = {}
    posmlp_t = None
    for name in names:
        torch.manual_seed(seed)
        if name in ('posmlp_t', 'published_port'):
            if posmlp_t is None:
                posmlp_t = PosMLP(posmlp_arch or 't', out_indices=(0, 1, 2, 3))
            model = posmlp_t if name == 'posmlp_t' else PublishedPort(posmlp_t)
        elif name == 'posmlp_s':
            model = PosMLP('s', out_indices=(0, 1, 2, 3))
        elif name == 'swin_t':
            model = _swin((2, 2, 6, 2))
        elif name == 'swin_s':
            model = _swin((2, 2, 18, 2))
        elif name == 'resnet50':
            model = _resnet50()
        else:
            raise ValueError(f'unknown model {name!r}; choose from '
                             f'{", ".join(ALL_MODELS)}')
        model.eval()  # (some mmdet backbones' train() returns None)
        models[name] = model
    return models


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ============================================================ measurements
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


def make_step(model: nn.Module, mode: str) -> Callable[[torch.Tensor], None]:
    """A function running one forward (or forward + backward) of ``model``."""
    if mode == 'fwd':
        def step(x):
            with torch.no_grad():
                model(x)
    elif mode == 'fwdbwd':
        def step(x):
            outs = model(x)
            loss = sum(o.float().mean() for o in outs)
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


def timed_call(step, x, device: torch.device, mem_interval: float
               ) -> Tuple[float, Optional[int]]:
    """(seconds, peak bytes) of one call."""
    with PeakMemory(device, mem_interval) as mem:
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        step(x)
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
    return elapsed, mem.peak


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


# ==================================================================== runs
def parse_size(text: str) -> Tuple[int, int]:
    text = text.strip().lower()
    if 'x' in text:
        h, w = text.split('x')
        return int(h), int(w)
    return int(text), int(text)


def size_name(size: Tuple[int, int]) -> str:
    return f'{size[0]}x{size[1]}'


def parse_list(text: Optional[str]) -> List[str]:
    if text is None or text.strip().lower() in ('', 'none'):
        return []
    return [t.strip() for t in text.split(',') if t.strip()]


def make_input(size: Tuple[int, int], batch: int, device: torch.device,
               seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(
        seed + 1000 * batch + size[0] + size[1])
    return torch.randn(batch, 3, *size, generator=gen).to(device)


def run_interleaved(models: Dict[str, nn.Module],
                    jobs: Sequence[Tuple[tuple, str, torch.Tensor]],
                    mode: str, repeats: int, warmup: int,
                    device: torch.device, mem_interval: float,
                    label: Callable[[tuple], str], start: float
                    ) -> Dict[tuple, dict]:
    """Time ``jobs`` = [(key, model name, input)] in interleaved rounds.

    First ``warmup`` untimed rounds, then ``repeats`` timed rounds; every
    round runs every job once, and the order of the jobs rotates from round
    to round, so that a drift of the machine's speed is shared by all.
    """
    runs = {key: dict(times=[], peaks=[], warmup_times=[], warmup_peaks=[])
            for key, _, _ in jobs}
    steps = {}
    for _, name, _ in jobs:
        if name not in steps:
            set_mode(models[name], mode)
            steps[name] = make_step(models[name], mode)
    try:
        for r in range(warmup + repeats):
            timed = r >= warmup
            k = (r - warmup) % len(jobs) if timed else 0
            for key, name, x in list(jobs[k:]) + list(jobs[:k]):
                t, peak = timed_call(steps[name], x, device, mem_interval)
                models[name].zero_grad(set_to_none=True)
                entry = runs[key]
                entry['times' if timed else 'warmup_times'].append(t)
                entry['peaks' if timed else 'warmup_peaks'].append(peak)
                which = (f'round {r - warmup + 1}/{repeats}' if timed
                         else f'warm-up {r + 1}/{warmup}')
                log(f'{label(key)}  {which}  {name:<15s} {t * 1e3:9.1f} ms',
                    start)
    finally:
        for name in steps:
            set_mode(models[name], 'fwd')
    return runs


def summarize(runs: dict, batch: int, macs: Optional[int]) -> dict:
    """Median latency, images/s, peak memory and achieved GFLOP/s (the
    fraction of the matmul calibration is added at the end of the run)."""
    times = runs['times']
    med = statistics.median(times)
    peaks = [p for p in runs['peaks'] if p is not None]
    out = dict(runs)
    out.update(median_s=med, min_s=min(times), max_s=max(times),
               images_per_s=batch / med,
               peak_mem_mb=(max(peaks) / 2 ** 20) if peaks else None)
    if macs is not None:
        flops = 2 * macs * batch
        out.update(gmacs_per_image=macs / 1e9,
                   gflops_per_s=flops / med / 1e9)
    return out


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


def port_check(models: Dict[str, nn.Module], size: Tuple[int, int],
               device: torch.device, seed: int) -> dict:
    """Largest difference of the published port's outputs from PosMLP's."""
    model, port = models['posmlp_t'], models['published_port']
    model.eval()
    x = make_input(size, 1, device, seed)
    with torch.no_grad():
        ref, got = model(x), port(x)
    diff = max(float((a - b).abs().max()) for a, b in zip(ref, got))
    scale = max(float(a.abs().max()) for a in ref)
    return dict(size=list(size), max_abs_diff=diff, max_abs_output=scale,
                ok=diff <= 1e-4 * max(1.0, scale))


# ============================================================== environment
def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def environment(device: torch.device) -> dict:
    env = dict(
        time=datetime.datetime.now().isoformat(timespec='seconds'),
        python=platform.python_version(), platform=platform.platform(),
        torch=torch.__version__, threads=torch.get_num_threads(),
        interop_threads=torch.get_num_interop_threads(),
        cpu_count=os.cpu_count(), device=str(device),
        mkldnn=torch.backends.mkldnn.is_available())
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
            ['git', 'rev-parse', 'HEAD'], cwd=REPO_ROOT, capture_output=True,
            text=True, timeout=10).stdout.strip()
        env['git_dirty_files'] = [
            line[3:] for line in subprocess.run(
                ['git', 'status', '--porcelain', '--untracked-files=no'],
                cwd=REPO_ROOT, capture_output=True, text=True,
                timeout=10).stdout.splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass
    return env


# ================================================================= reports
def find(results, model, size, batch, mode):
    for r in results:
        if (r['model'], tuple(r['size']), r['batch'], r['mode']) == (
                model, tuple(size), batch, mode):
            return r
    return None


def target_lines(report: dict) -> dict:
    """Ratios for the targets of issue 6.

    Each ratio from the medians (what the targets are judged on) and from
    the fastest runs (``*_min``): on a busy machine other processes only
    ever slow a run down, so the fastest runs are the steadier estimate.
    """
    res = report['results']
    det = (800, 1333)
    out = dict(posmlp_vs_swin=[], posmlp_vs_port=[], scaling={})
    for r in res:
        if r['model'] != 'posmlp_t':
            continue
        swin = find(res, 'swin_t', r['size'], r['batch'], r['mode'])
        if swin is not None:
            lat = r['median_s'] / swin['median_s']
            mem = (r['peak_mem_mb'] / swin['peak_mem_mb']
                   if r['peak_mem_mb'] and swin['peak_mem_mb'] else None)
            entry = dict(size=r['size'], batch=r['batch'], mode=r['mode'],
                         latency_ratio=lat,
                         latency_ratio_min=r['min_s'] / swin['min_s'],
                         peak_mem_ratio=mem)
            if tuple(r['size']) == det and r['mode'] == 'fwd':
                entry['target'] = 'latency ratio <= 1.0, memory ratio <= 1.0'
                entry['met'] = lat <= 1.0 and (mem is None or mem <= 1.0)
            out['posmlp_vs_swin'].append(entry)
        port = find(res, 'published_port', r['size'], r['batch'], r['mode'])
        if port is not None:
            speedup = port['median_s'] / r['median_s']
            entry = dict(size=r['size'], batch=r['batch'], mode=r['mode'],
                         speedup=speedup,
                         speedup_min=port['min_s'] / r['min_s'])
            if r['mode'] == 'fwd':
                entry['target'] = 'speedup >= 1.5'
                entry['met'] = speedup >= 1.5
            out['posmlp_vs_port'].append(entry)
    for name, s in report.get('scaling', {}).items():
        out['scaling'][name] = dict(exponent=s['exponent'], r2=s['r2'],
                                    exponent_min=s.get('exponent_min'))
    return out


def busy_warning(report: dict) -> Optional[str]:
    """A warning when the machine was visibly busy during the run."""
    env, cal = report['environment'], report['calibration']
    speeds = cal.get('all_gflops') or [cal['peak_gflops']]
    loads = [v[0] for v in (env.get('loadavg_start'), env.get('loadavg_end'))
             if v]
    loads += [r['loadavg'][0] for r in report['results'] if r.get('loadavg')]
    cores = env.get('cpu_count') or 1
    spread = max(speeds) / max(min(speeds), 1e-9)
    if env['device'] == 'cpu' and (spread > 1.5 or (loads and max(loads)
                                                    > 1.5 * cores)):
        return (f"**The machine was busy during this run** (load average up "
                f"to {max(loads):.1f} on {cores} cores; the matmul "
                f"calibration ranged {min(speeds):.1f}-{max(speeds):.1f} "
                f"GFLOP/s): latencies are inflated and noisy, and a run "
                f"that caught a quiet moment can make even the fastest-run "
                f"figures lopsided. Re-run on an idle machine before "
                f"drawing conclusions.")
    return None


def _fmt(value, spec, missing='-'):
    return missing if value is None else format(value, spec)


def markdown(report: dict) -> str:
    env, cal = report['environment'], report['calibration']
    cal.setdefault('all_gflops', [cal['peak_gflops']])
    cfg = report['config']
    load = [(env.get(k) or [None])[0] for k in ('loadavg_start',
                                                 'loadavg_end')]
    lines = [
        '### Backbone benchmark', '',
        f"- Machine: {env.get('cpu_model', '?')}, {env['threads']} torch "
        f"threads (torch's default), torch {env['torch']}, device "
        f"{env['device']}"
        + (f" ({env['cuda_device']})" if env.get('cuda_device') else '')
        + f"; load average {_fmt(load[0], '.1f')} at the start, "
        f"{_fmt(load[1], '.1f')} at the end.",
        f"- Matmul calibration ({cal['start']['n']}^3 fp32 `torch.mm`): "
        f"fastest {cal['peak_gflops']:.1f} GFLOP/s, slowest "
        f"{min(cal['all_gflops']):.1f} of {len(cal['all_gflops'])} "
        f"measured during the run; \"% of matmul\" is against the fastest.",
        f"- Median of {cfg['repeats']} timed runs per model, interleaved "
        f"round by round on the same input, after {cfg['warmup']} warm-up "
        f"run(s); random initialization.",
        "- fwd: eval mode without autograd; fwdbwd: train mode, forward and "
        "backward of the mean of every output level.",
        "- GMACs per image: `torch.utils.flop_counter` FLOPs / 2 at batch 1 "
        "(convolutions, linear layers and every matmul, the token mixing "
        "included).",
        f"- Peak memory: {report['memory_method']}.", '',
        '| model | input | batch | mode | median (ms) | min (ms) | images/s '
        '| peak mem (MB) | params (M) | GMACs/img | GFLOP/s | % of matmul |',
        '| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: '
        '| ---: | ---: |']
    warning = busy_warning(report)
    if warning:
        lines[2:2] = [warning, '']
    for r in report['results']:
        share = r.get('fraction_of_matmul')
        share = None if share is None else 100 * share
        lines.append(
            f"| {LABELS.get(r['model'], r['model'])} | {size_name(r['size'])}"
            f" | {r['batch']} | {r['mode']} | {r['median_s'] * 1e3:.1f} | "
            f"{r['min_s'] * 1e3:.1f} | {r['images_per_s']:.2f} | "
            f"{_fmt(r['peak_mem_mb'], '.0f')} | "
            f"{r['params'] / 1e6:.1f} | "
            f"{_fmt(r.get('gmacs_per_image'), '.2f')} | "
            f"{_fmt(r.get('gflops_per_s'), '.1f')} | {_fmt(share, '.0f')} |")
    t = report['targets']
    if t['posmlp_vs_swin'] or t['posmlp_vs_port']:
        lines += ['', 'PosMLP-T against Swin-T (latency and peak-memory '
                  'ratios, below 1 is better) and against the published port '
                  '(speedup); median and, in brackets, from the fastest runs:',
                  '', '| PosMLP-T against | input | batch | mode | '
                  'latency ratio | peak-memory ratio | speedup | target |',
                  '| --- | --- | ---: | --- | ---: | ---: | ---: | --- |']

        def verdict(e):
            if 'met' not in e:
                return ''
            return f"{e['target']} ({'met' if e['met'] else 'NOT met'})"
        for e in t['posmlp_vs_swin']:
            lines.append(
                f"| Swin-T | {size_name(e['size'])} | {e['batch']} | "
                f"{e['mode']} | {e['latency_ratio']:.2f} "
                f"({_fmt(e.get('latency_ratio_min'), '.2f')}) | "
                f"{_fmt(e['peak_mem_ratio'], '.2f')} | - | {verdict(e)} |")
        for e in t['posmlp_vs_port']:
            lines.append(
                f"| published port | {size_name(e['size'])} | {e['batch']} | "
                f"{e['mode']} | {1 / e['speedup']:.2f} | - | "
                f"{e['speedup']:.2f}x ({_fmt(e.get('speedup_min'), '.2f')}x) "
                f"| {verdict(e)} |")
    if report.get('scaling'):
        sizes = None
        rows = []
        for name, s in report['scaling'].items():
            sizes = s['sizes']
            rows.append(
                f"| {LABELS.get(name, name)} | "
                + ' | '.join(f'{v * 1e3:.0f}' for v in s['median_s'])
                + f" | {_fmt(s['exponent'], '.2f')} (R^2 "
                f"{_fmt(s['r2'], '.2f')}) | "
                f"{_fmt(s.get('exponent_min'), '.2f')} (R^2 "
                f"{_fmt(s.get('r2_min'), '.2f')}) |")
        lines += ['', 'Forward latency (median ms, batch 1) against input '
                  'size, and the exponent k of latency ~ pixels^k (least '
                  'squares in log-log; 1.0 is linear in pixels), from the '
                  'medians and from the fastest runs:', '',
                  '| model | ' + ' | '.join(size_name(s) for s in sizes)
                  + ' | k (medians) | k (fastest) |',
                  '| --- | ' + ' | '.join('---:' for _ in sizes)
                  + ' | ---: | ---: |'] + rows
    if report.get('port_check'):
        c = report['port_check']
        lines += ['', f"Published port against PosMLP-T at "
                  f"{size_name(c['size'])}: largest output difference "
                  f"{c['max_abs_diff']:.2e} (outputs up to "
                  f"{c['max_abs_output']:.1f})."]
    lines += ['', f"Run time: {report['run_seconds'] / 60:.1f} min."]
    return '\n'.join(lines) + '\n'


def chart(report: dict, path: str):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    res = report['results']
    modes = [m for m in MODES if any(r['mode'] == m for r in res)]
    panels = len(modes) + (1 if report.get('scaling') else 0)
    if panels == 0:
        return
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8),
                             squeeze=False)
    axes = axes[0]
    colors = {n: f'C{i}' for i, n in enumerate(ALL_MODELS)}
    for ax, mode in zip(axes, modes):
        names = [n for n in ALL_MODELS
                 if any(r['model'] == n and r['mode'] == mode for r in res)]
        groups = []
        for r in res:
            key = (tuple(r['size']), r['batch'])
            if r['mode'] == mode and key not in groups:
                groups.append(key)
        width = 0.8 / max(len(names), 1)
        lowest = math.inf
        for j, name in enumerate(names):
            xs, ys = [], []
            for g, (size, batch) in enumerate(groups):
                r = find(res, name, size, batch, mode)
                if r is not None:
                    xs.append(g + (j - (len(names) - 1) / 2) * width)
                    ys.append(r['median_s'] * 1e3)
            if xs:
                ax.bar(xs, ys, width, label=LABELS[name], color=colors[name])
                lowest = min(lowest, min(ys))
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f'{size_name(s)}\nb{b}' for s, b in groups])
        ax.set_yscale('log')
        if lowest < math.inf:
            ax.set_ylim(bottom=lowest / 3)
        ax.set_ylabel('median latency (ms, log)')
        ax.set_title(f'backbone {mode}')
        ax.grid(axis='y', alpha=0.3)
        ax.legend(fontsize=8)
    if report.get('scaling'):
        ax = axes[-1]
        for name, s in report['scaling'].items():
            px = [h * w for h, w in s['sizes']]
            ax.loglog(px, s['median_s'], 'o-', color=colors.get(name),
                      label=f"{LABELS.get(name, name)} "
                            f"(k={_fmt(s['exponent'], '.2f')})")
        if report['scaling']:
            first = next(iter(report['scaling'].values()))
            px = [h * w for h, w in first['sizes']]
            ref = [first['median_s'][0] * p / px[0] for p in px]
            ax.loglog(px, ref, 'k:', label='linear in pixels')
        ax.set_xlabel('pixels')
        ax.set_ylabel('forward latency (s), batch 1')
        ax.set_title('latency ~ pixels^k')
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ==================================================================== main
def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true',
                   help='a subset of a few minutes (explicit flags still '
                        'override it)')
    p.add_argument('--models', help=f'comma list from {",".join(ALL_MODELS)} '
                   f'(default: all; the fwdbwd and scaling runs take theirs '
                   f'from --fwdbwd-models and --scaling-models)')
    p.add_argument('--sizes', help='input sizes HxW or S (square), comma '
                   f'list (default {DEFAULTS["sizes"]})')
    p.add_argument('--batches', help=f'default {DEFAULTS["batches"]}')
    p.add_argument('--modes', help=f'fwd and/or fwdbwd (default '
                   f'{DEFAULTS["modes"]})')
    p.add_argument('--fwdbwd-models', help='models that also run fwdbwd '
                   f'(default {DEFAULTS["fwdbwd_models"]}; "all" for all)')
    p.add_argument('--fwdbwd-max-pixels', type=int, help='fwdbwd runs only '
                   'at the --sizes with at most this many pixels (default '
                   f'{DEFAULTS["fwdbwd_max_pixels"]}; 0: all sizes)')
    p.add_argument('--repeats', type=int, help='timed runs per model and '
                   f'setting (default {DEFAULTS["repeats"]})')
    p.add_argument('--warmup', type=int, help='untimed runs of every model '
                   'before the first batch of each size and mode (default '
                   f'{DEFAULTS["warmup"]})')
    p.add_argument('--warmup-each', action='store_true',
                   help='warm up before every batch, not only the first')
    p.add_argument('--scaling-sizes', help='square sizes of the scaling fit '
                   f'(default {DEFAULTS["scaling_sizes"]}; "none" to skip)')
    p.add_argument('--scaling-models', help='default '
                   f'{DEFAULTS["scaling_models"]}')
    p.add_argument('--scaling-repeats', type=int)
    p.add_argument('--check-size', default='224', help='size at which the '
                   'published port is checked against PosMLP-T ("none" to '
                   'skip); windows must tile every level')
    p.add_argument('--posmlp-arch', help='JSON dict: custom arch for posmlp_t '
                   'and the published port (for tests)')
    p.add_argument('--device', default='auto', choices=('auto', 'cpu',
                                                        'cuda'))
    p.add_argument('--calib-size', type=int, help='matmul calibration size '
                   '(default 2048 on CPU, 8192 on CUDA)')
    p.add_argument('--mem-interval-ms', type=float, default=1.0,
                   help='RSS sampling interval on CPU')
    p.add_argument('--no-count', action='store_true',
                   help='skip the MAC counting')
    p.add_argument('--real-count', action='store_true',
                   help='count MACs on real tensors (default: fake tensors, '
                        'same counts without the arithmetic)')
    p.add_argument('--no-chart', action='store_true')
    p.add_argument('--from-json', metavar='JSON',
                   help='run nothing: rewrite the Markdown and the chart of '
                        'an earlier run next to its JSON')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=os.path.join('work_dirs', 'benchmark',
                                                 'benchmark.json'))
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def write_outputs(report: dict, out: str, with_chart: bool = True) -> str:
    """benchmark.md and benchmark.png next to ``out``; returns the table."""
    stem = os.path.splitext(out)[0]
    md = markdown(report)
    with open(stem + '.md', 'w') as f:
        f.write(md)
    report['files'] = dict(json=out, markdown=stem + '.md')
    if with_chart:
        chart(report, stem + '.png')
        report['files']['chart'] = stem + '.png'
    return md


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        for fit in report.get('scaling', {}).values():
            if 'exponent_min' not in fit and 'times' in fit:
                fit['min_s'] = [min(t) for t in fit['times']]
                fast = fit_exponent(fit['pixels'], fit['min_s'])
                fit['exponent_min'], fit['r2_min'] = fast['exponent'], \
                    fast['r2']
        report['targets'] = target_lines(report)
        print(write_outputs(report, args.from_json, not args.no_chart))
        return report
    start = time.perf_counter()
    if args.device == 'auto':
        device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    else:
        device = torch.device(args.device)
    names = parse_list(args.models)
    for n in names:
        if n not in ALL_MODELS:
            raise SystemExit(f'unknown model {n!r}; choose from '
                             f'{", ".join(ALL_MODELS)}')
    fb = parse_list(args.fwdbwd_models)
    fwdbwd_names = [n for n in names if 'all' in fb or n in fb]
    sizes = [parse_size(s) for s in parse_list(args.sizes)]
    fwdbwd_sizes = [s for s in sizes if args.fwdbwd_max_pixels <= 0
                    or s[0] * s[1] <= args.fwdbwd_max_pixels]
    batches = [int(b) for b in parse_list(args.batches)]
    modes = parse_list(args.modes)
    for m in modes:
        if m not in MODES:
            raise SystemExit(f'unknown mode {m!r}; choose from {MODES}')
    scaling_sizes = [parse_size(s) for s in parse_list(args.scaling_sizes)]
    scaling_names = [n for n in parse_list(args.scaling_models)]
    posmlp_arch = json.loads(args.posmlp_arch) if args.posmlp_arch else None
    mem_interval = args.mem_interval_ms / 1e3
    calib_n = args.calib_size or (8192 if device.type == 'cuda' else 2048)
    needed = list(dict.fromkeys(names + (scaling_names if scaling_sizes
                                         else [])))

    env = environment(device)
    log(f'torch {env["torch"]}, {env["threads"]} threads (torch default), '
        f'device {device}, CPU {env.get("cpu_model", "?")}')
    log(f'models {", ".join(needed)}; sizes '
        f'{", ".join(size_name(s) for s in sizes)}; batches {batches}; '
        f'modes {modes}; {args.repeats} repeats after {args.warmup} warm-up',
        start)
    models = build_models(needed, posmlp_arch, args.seed)
    for m in models.values():
        m.to(device)
    params = {n: count_params(m) for n, m in models.items()}
    with PeakMemory(device, mem_interval) as probe:
        pass
    mem_method = probe.method
    calib_start = matmul_calibration(device, calib_n)
    log(f'peak memory method: {mem_method}', start)
    log(f'matmul calibration: {calib_start["gflops"]:.1f} GFLOP/s', start)

    report = dict(
        config=dict(vars(args), models=names, sizes=[list(s) for s in sizes],
                    batches=batches, modes=modes, fwdbwd_models=fwdbwd_names,
                    fwdbwd_sizes=[list(s) for s in fwdbwd_sizes],
                    scaling_sizes=[list(s) for s in scaling_sizes],
                    scaling_models=scaling_names),
        environment=env, params=params,
        memory_method_key=mem_method,
        memory_method=MEMORY_METHODS[mem_method].format(
            interval=f'{args.mem_interval_ms:g}')
        + '; max over the timed runs',
        results=[], scaling={}, macs={})

    if ('posmlp_t' in models and 'published_port' in models
            and args.check_size.lower() != 'none'):
        report['port_check'] = port_check(models, parse_size(args.check_size),
                                          device, args.seed)
        c = report['port_check']
        verdict = 'ok' if c['ok'] else 'MISMATCH'
        log(f'published port vs PosMLP-T at {size_name(c["size"])}: max abs '
            f'diff {c["max_abs_diff"]:.2e} ({verdict})', start)

    macs_cache: Dict[tuple, Optional[int]] = {}

    def macs_of(name, size, mode):
        key = (name, size, mode)
        if args.no_count:
            return None
        if key not in macs_cache:
            total, by_op, how = count_macs(models[name], size, mode, device,
                                           fake=not args.real_count)
            macs_cache[key] = total
            report['macs'].setdefault(name, {}).setdefault(mode, {})[
                size_name(size)] = dict(gmacs=total / 1e9, flops_by_op=by_op,
                                        counted_on=how)
            log(f'counted {name} {size_name(size)} {mode}: '
                f'{total / 1e9:.2f} GMACs', start)
        return macs_cache[key]

    calibs = [calib_start]
    for mode in modes:
        mode_names = names if mode == 'fwd' else fwdbwd_names
        if not mode_names:
            continue
        for size in (sizes if mode == 'fwd' else fwdbwd_sizes):
            for bi, batch in enumerate(batches):
                x = make_input(size, batch, device, args.seed)
                macs = {n: macs_of(n, size, mode) for n in mode_names}
                what = f'{mode:<6s} {size_name(size):>9s} b{batch}'
                warmup = args.warmup if bi == 0 or args.warmup_each else 0
                local = matmul_calibration(device, calib_n, repeats=2)
                runs = run_interleaved(
                    models, [((n,), n, x) for n in mode_names], mode,
                    args.repeats, warmup, device, mem_interval,
                    lambda key: what, start)
                calibs.append(local)
                state = dict(calib_gflops_before=local['gflops'],
                             loadavg=_loadavg())
                for n in mode_names:
                    r = summarize(runs[(n,)], batch, macs[n])
                    r.update(model=n, size=list(size), batch=batch, mode=mode,
                             params=params[n], **state)
                    report['results'].append(r)
                    log(f'{what}  {n:<15s} median {r["median_s"] * 1e3:9.1f}'
                        f' ms  {r["images_per_s"]:7.2f} img/s  peak '
                        f'{_fmt(r["peak_mem_mb"], ".0f")} MB', start)
                del x

    if scaling_sizes and scaling_names:
        # one set of rounds over every (size, model): a drift of the
        # machine's speed during the sweep does not bend the curve
        inputs = {s: make_input(s, 1, device, args.seed)
                  for s in scaling_sizes}
        jobs = [((s, n), n, inputs[s]) for s in scaling_sizes
                for n in scaling_names]
        runs = run_interleaved(
            models, jobs, 'fwd', args.scaling_repeats, args.warmup, device,
            mem_interval, lambda key: f'scaling {size_name(key[0]):>9s} b1',
            start)
        del inputs
        for n in scaling_names:
            pixels = [h * w for h, w in scaling_sizes]
            med = [statistics.median(runs[(s, n)]['times'])
                   for s in scaling_sizes]
            fastest = [min(runs[(s, n)]['times']) for s in scaling_sizes]
            fit = fit_exponent(pixels, med)
            fit_min = fit_exponent(pixels, fastest)
            report['scaling'][n] = dict(
                sizes=[list(s) for s in scaling_sizes], pixels=pixels,
                median_s=med, min_s=fastest,
                times=[runs[(s, n)]['times'] for s in scaling_sizes],
                exponent_min=fit_min['exponent'], r2_min=fit_min['r2'], **fit)
            log(f'scaling {n}: latency ~ pixels^{_fmt(fit["exponent"], ".3f")}'
                f' (R^2 {_fmt(fit["r2"], ".3f")})', start)

    calib_end = matmul_calibration(device, calib_n)
    calibs.append(calib_end)
    peak = max(c['gflops'] for c in calibs)
    report['calibration'] = dict(
        start=calib_start, end=calib_end, peak_gflops=peak,
        all_gflops=[c['gflops'] for c in calibs],
        note='peak_gflops: the fastest of all calibrations in this run (one '
             'at the start, one before every setting, one at the end)')
    log(f'matmul calibration at the end: {calib_end["gflops"]:.1f} GFLOP/s; '
        f'range over the run {min(c["gflops"] for c in calibs):.1f} - '
        f'{peak:.1f}', start)
    for r in report['results']:
        if r.get('gflops_per_s') is not None:
            r['fraction_of_matmul'] = r['gflops_per_s'] / peak
    try:
        env['loadavg_end'] = os.getloadavg()
    except OSError:
        pass
    report['targets'] = target_lines(report)
    report['run_seconds'] = time.perf_counter() - start

    out = args.out
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(report, f, indent=1)
    md = write_outputs(report, out, not args.no_chart)
    print()
    print(md, flush=True)
    log(f'wrote {", ".join(report["files"].values())}', start)
    return report


if __name__ == '__main__':
    main()
