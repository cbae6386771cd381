"""What fusion leaves: the kernels inductor makes of one step, and the
bytes they move.

The GPU proxy (gpu_proxy.py) counts an eager step: every ATen operation is
a launch and writes its whole output. Under ``torch.compile`` inductor
fuses elementwise work into the kernels around it, so a compiled step has
fewer launches and moves fewer bytes. This module compiles a step of a
model at one input size (inductor, static shapes), runs it once, and reads
what inductor reports of each graph it lowered (the forward, and in
training the backward): its scheduler's nodes after fusion, each one
kernel launch (a generated kernel, or an extern call such as a matmul or a
convolution), and ``num_bytes_accessed``, the bytes those kernels read and
write (inductor's ``inductor_metrics`` log artifact).

Counted on this machine's inductor backend (C++ on a CPU). The same graphs
lowered for CUDA fuse much alike but not identically (Triton templates,
other fusion limits): a proxy, to set beside the eager counts, not a GPU
measurement. Eager bytes count writes only; these count reads and writes.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Sequence, Tuple

import torch
from torch import nn

from .gpu_proxy import count_step
from .measure import make_input, make_step, set_mode
from .models import LABELS

STEP_MODES = {'inference': 'fwd', 'train': 'fwdbwd'}

# the logger inductor writes each lowered graph's metrics to, when the
# ``inductor_metrics`` artifact is on
_METRICS_LOGGER = 'torch._inductor.compile_fx.__inductor_metrics'


class _GraphMetrics(logging.Handler):
    """Keeps the metrics of every graph inductor lowers while attached."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.graphs: List[dict] = []

    def emit(self, record: logging.LogRecord):
        args = record.args
        if isinstance(args, tuple) and len(args) == 1:
            args = args[0]
        if isinstance(args, dict) and 'num_bytes_accessed' in args:
            nodes = [node for node, _ in args['nodes_num_elem']]
            self.graphs.append(dict(
                bytes_accessed=int(args['num_bytes_accessed']),
                kernels=len(nodes),
                extern_kernels=sum(type(n).__name__ ==
                                   'ExternKernelSchedulerNode'
                                   for n in nodes)))


def count_compiled_step(model: nn.Module, mode: str,
                        shape: Tuple[int, int, int], seed: int = 0) -> dict:
    """Kernels and bytes of ``model``'s ``mode`` step ('inference' or
    'train', as in gpu_proxy) compiled by inductor for input ``shape`` =
    (batch, height, width) on the CPU: totals over the lowered graphs, and
    each graph's own (``graphs``: forward first)."""
    if mode not in STEP_MODES:
        raise ValueError(f'unknown mode {mode!r}; choose from '
                         f'{", ".join(STEP_MODES)}')
    batch, h, w = shape
    x = make_input((h, w), batch, torch.device('cpu'), seed)
    set_mode(model, STEP_MODES[mode])
    handler = _GraphMetrics()
    logger = logging.getLogger(_METRICS_LOGGER)
    torch._dynamo.reset()
    # inductor reports a graph's metrics only where this logger takes INFO
    saved = logger.level, logger.handlers, logger.propagate
    logger.setLevel(logging.INFO)
    logger.handlers, logger.propagate = [handler], False  # kept, not printed
    try:
        # a cached graph would skip the lowering that reports the metrics
        with torch._inductor.config.patch(fx_graph_cache=False), \
                torch._functorch.config.patch(enable_autograd_cache=False):
            compiled = torch.compile(model, dynamic=False, fullgraph=True)
            make_step(compiled, STEP_MODES[mode])(x)
    finally:
        logger.setLevel(saved[0])
        logger.handlers, logger.propagate = saved[1], saved[2]
        model.zero_grad(set_to_none=True)
        set_mode(model, 'fwd')
        torch._dynamo.reset()
    if not handler.graphs:
        raise RuntimeError('inductor reported no graph metrics: was the '
                           'step compiled?')
    return dict(kernels=sum(g['kernels'] for g in handler.graphs),
                extern_kernels=sum(g['extern_kernels']
                                   for g in handler.graphs),
                bytes_accessed=sum(g['bytes_accessed']
                                   for g in handler.graphs),
                graphs=handler.graphs)


def run_inductor_counts(models: Dict[str, nn.Module],
                        steps: Sequence[Tuple[str, Sequence[int]]],
                        seed: int = 0, log=print) -> dict:
    """A row per (step, model): ``count_compiled_step``, and the eager
    step's operations and bytes written (gpu_proxy.count_step, fp32, on
    CPU tensors) under 'eager'."""
    rows = []
    for mode, shape in steps:
        for name, model in models.items():
            eager = count_step(model, mode, tuple(shape), 'cpu', seed)
            counts = count_compiled_step(model, mode, tuple(shape), seed)
            log(f'inductor {mode} {"x".join(map(str, shape))} {name}: '
                f'{counts["kernels"]} kernels ({counts["extern_kernels"]} '
                f'extern), {counts["bytes_accessed"] / 1e9:.3f} GB read and '
                f'written, {len(counts["graphs"])} graphs; eager '
                f'{eager["ops"]} operations, '
                f'{eager["bytes_written"] / 1e9:.3f} GB written')
            rows.append(dict(model=name, mode=mode, shape=list(shape),
                             eager=dict(ops=eager['ops'],
                                        bytes_written=eager['bytes_written']),
                             **counts))
    return dict(backend='inductor', device='cpu', torch=torch.__version__,
                rows=rows)


def inductor_counts_markdown(report: dict, heading: str = '###'
                             ) -> List[str]:
    """The section of ``run_inductor_counts``'s rows (report key
    'inductor_counts'), with PosMLP-T / Swin-T ratios where both ran."""
    c = report.get('inductor_counts')
    if not c:
        return []
    env = report.get('environment', {})
    lines = [
        '', f'{heading} What fusion leaves: inductor kernels and bytes', '',
        f"Each step compiled with `torch.compile(model, dynamic=False)` "
        f"(inductor, {c['device']} backend) at its size, with torch "
        f"{c['torch']} at commit {(env.get('git_commit') or '?')[:7]}: the "
        f"kernels of the graphs inductor lowered (forward, and backward in "
        f"training) after fusion, extern calls (matmuls, convolutions) "
        f"among them, and the bytes they read and write (inductor's "
        f"`num_bytes_accessed`). Beside them the eager step's operations "
        f"and bytes written, as the GPU proxy counts them (fp32). A CUDA "
        f"lowering fuses much alike, not identically: a proxy.", '',
        '| step | model | eager operations | eager bytes written (GB) | '
        'compiled kernels (extern) | compiled bytes read + written (GB) |',
        '| --- | --- | ---: | ---: | ---: | ---: |']
    for r in c['rows']:
        b, h, w = r['shape']
        lines.append(
            f"| {r['mode']} {b}x3x{h}x{w} | {LABELS.get(r['model'], r['model'])}"
            f" | {r['eager']['ops']:,} | {r['eager']['bytes_written'] / 1e9:.3f}"
            f" | {r['kernels']:,} ({r['extern_kernels']:,}) | "
            f"{r['bytes_accessed'] / 1e9:.3f} |")
    ratios = []
    for r in c['rows']:
        if r['model'] != 'posmlp_t':
            continue
        swin = next((s for s in c['rows'] if s['model'] == 'swin_t' and
                     (s['mode'], s['shape']) == (r['mode'], r['shape'])),
                    None)
        if swin is None:
            continue
        b, h, w = r['shape']
        ratios.append(
            f"| {r['mode']} {b}x3x{h}x{w} | "
            f"{r['eager']['ops'] / swin['eager']['ops']:.2f} | "
            f"{r['eager']['bytes_written'] / swin['eager']['bytes_written']:.2f}"
            f" | {r['kernels'] / swin['kernels']:.2f} | "
            f"{r['bytes_accessed'] / swin['bytes_accessed']:.2f} |")
    if ratios:
        lines += ['', 'PosMLP-T / Swin-T (below 1 is better):', '',
                  '| step | eager operations | eager bytes written | '
                  'compiled kernels | compiled bytes |',
                  '| --- | ---: | ---: | ---: | ---: |'] + ratios
    return lines
