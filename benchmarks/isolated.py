"""Backbones timed against each other, each in a process of its own
(``tools/compare_models.py`` is the command line).

In one process the models are coupled through the allocator: on a CPU,
glibc's malloc serves a large request from memory another model freed when
there is such a block, and maps fresh pages from the OS (faulted in one by
one, at every call) when there is not. In a process of its own a model
meets only its own allocations, as in a user's job.
"""
from __future__ import annotations

import multiprocessing
import statistics
import time
from typing import Sequence

import torch

from .measure import median_faults, minor_page_faults
from .models import build_models


def worker(name: str, mode: str, shape, seed: int, conn):
    """Build ``name`` in this process, then run one step per 'go' and
    answer (seconds, minor page faults) until 'stop'."""
    try:
        model = build_models([name], seed=seed)[name]
        model.train(mode == 'train')
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(*shape, generator=gen)
        weights = None

        def step():
            nonlocal weights
            if mode == 'inference':
                with torch.no_grad():
                    model(x)
                return
            outs = model(x)
            if weights is None:
                weights = [torch.randn(o.shape, generator=gen)
                           for o in outs]
            sum((o * w).sum() for o, w in zip(outs, weights)).backward()
            model.zero_grad(set_to_none=True)
    except Exception as e:  # the coordinator raises it
        conn.send(('error', f'{type(e).__name__}: {e}'))
        return
    conn.send(('ready', None))
    while conn.recv() == 'go':
        faults = minor_page_faults()
        t0 = time.perf_counter()
        try:
            step()
        except Exception as e:
            conn.send(('error', f'{type(e).__name__}: {e}'))
            return
        elapsed = time.perf_counter() - t0
        conn.send((elapsed, None if faults is None
                   else minor_page_faults() - faults))


def compare_in_processes(models: Sequence[str], mode: str, shape,
                         rounds: int, warmup: int = 2, seed: int = 0
                         ) -> dict:
    """Every model in a spawned process of its own; the coordinator
    alternates their steps (the order flips every round). ``mode``:
    'train' or 'inference'. Returns per model the timed steps, median,
    fastest and page faults per step, and the first model's ratios to the
    others (medians, fastest, paired round by round)."""
    ctx = multiprocessing.get_context('spawn')
    conns, procs = {}, []
    try:
        for name in models:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=worker, daemon=True, args=(
                name, mode, shape, seed, there))
            proc.start()
            conns[name] = here
            procs.append(proc)
        for name, conn in conns.items():
            status, why = conn.recv()
            if status != 'ready':
                raise RuntimeError(f'building {name} failed in its process: '
                                   f'{why}')
        steps = {name: [] for name in models}
        for r in range(warmup + rounds):
            order = models if r % 2 == 0 else models[::-1]
            for name in order:
                conns[name].send('go')
                result = conns[name].recv()
                if result[0] == 'error':
                    raise RuntimeError(f'a step of {name} failed in its '
                                       f'process: {result[1]}')
                if r >= warmup:
                    steps[name].append(result)
    finally:
        for conn in conns.values():
            try:
                conn.send('stop')
            except (BrokenPipeError, OSError):
                pass
        for proc in procs:
            proc.join(timeout=60)
    out = dict(mode=mode, shape=list(shape), rounds=rounds,
               models={})
    for name, results in steps.items():
        times = [t for t, _ in results]
        out['models'][name] = dict(
            times=times, median_s=statistics.median(times),
            min_s=min(times),
            page_faults=median_faults([f for _, f in results]))
    first, *others = models
    a = out['models'][first]
    out['ratios'] = {}
    for name in others:
        b = out['models'][name]
        out['ratios'][name] = dict(
            medians=a['median_s'] / b['median_s'],
            fastest=a['min_s'] / b['min_s'],
            paired=statistics.median(
                x / y for x, y in zip(a['times'], b['times'])))
    return out
