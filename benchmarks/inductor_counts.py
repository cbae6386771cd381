"""What fusion leaves: the kernels inductor makes of one step (static
shapes, this machine's backend: C++ on a CPU) and the bytes they read and
write, from inductor's ``inductor_metrics`` log of each graph it lowers.
A proxy for a CUDA lowering, which fuses much alike (docs/performance.md).
A kernel is a node of inductor's schedule that emits code: a no-op node
(a ``cat`` whose inputs' kernels write straight into its slices) is
counted apart, as ``no_op_nodes``.

Inductor counts an extern kernel (a matmul, a convolution) as reading
every buffer it touches whole, since it cannot see inside the call. A
matmul that reads one block's slice of a stacked tensor is then charged
the whole stack. ``bytes_by_extent`` charges each extern operand the span
of memory its view covers instead (never more than inductor's figure);
generated kernels are counted as inductor counts them.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from .gpu_proxy import count_step
from .steps import STEP_MODES, make_input, make_step, set_mode

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
            nodes = args['nodes_num_elem']
            externs = [(node, elements) for node, elements in nodes
                       if type(node).__name__ == 'ExternKernelSchedulerNode']
            # a no-op node (a cat whose inputs' kernels write its slices)
            # emits no code: a node of the schedule but not a kernel
            no_ops = sum(type(node).__name__ == 'NopKernelSchedulerNode'
                         for node, _ in nodes)
            # (inductor's per-node figure is its bytes // 4)
            overcount = sum(4 * elements - _extern_extent_bytes(
                node, 4 * elements) for node, elements in externs)
            total = int(args['num_bytes_accessed'])
            self.graphs.append(dict(
                bytes_accessed=total, bytes_by_extent=total - overcount,
                kernels=len(nodes) - no_ops, extern_kernels=len(externs),
                no_op_nodes=no_ops))


def _span_bytes(tensor) -> Optional[int]:
    """Bytes of memory an inductor IR tensor's (possibly strided) view
    spans, or None where its layout has no fixed sizes and strides."""
    try:
        sizes = [int(n) for n in tensor.get_size()]
        strides = [int(n) for n in tensor.get_stride()]
        itemsize = tensor.get_dtype().itemsize
    except (AttributeError, NotImplementedError, TypeError, ValueError):
        return None
    if 0 in sizes:
        return 0
    return (1 + sum((n - 1) * s for n, s in zip(sizes, strides))) * itemsize


def _extern_extent_bytes(node, counted: int) -> int:
    """An extern kernel's bytes with each operand and its output charged
    the span its view covers; ``counted`` (inductor's whole-buffer figure)
    where a layout is not fixed, and never more than it."""
    spans = [_span_bytes(t) for t in (*getattr(node.node, 'inputs', ()),
                                      node.node)]
    if any(span is None for span in spans):
        return counted
    return min(counted, sum(spans))


def count_compiled_step(model: nn.Module, mode: str,
                        shape: Tuple[int, int, int], seed: int = 0,
                        freezing: bool = False) -> dict:
    """Kernels and bytes of ``model``'s ``mode`` step ('inference' or
    'train', as in gpu_proxy) compiled by inductor for input ``shape`` =
    (batch, height, width) on the CPU: totals over the lowered graphs, and
    each graph's own (``graphs``: forward first). ``bytes_accessed`` is
    inductor's figure, ``bytes_by_extent`` the module docstring's.
    ``freezing``: inductor's ``freezing`` (inference only): the parameters
    are constants, and what depends on them alone is computed once, at
    compile time."""
    if mode not in STEP_MODES:
        raise ValueError(f'unknown mode {mode!r}; choose from '
                         f'{", ".join(STEP_MODES)}')
    if freezing and mode != 'inference':
        raise ValueError(f'freezing makes the parameters constants: it '
                         f'compiles inference only, not {mode!r}')
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
        with torch._inductor.config.patch(fx_graph_cache=False,
                                          freezing=freezing), \
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
                no_op_nodes=sum(g['no_op_nodes'] for g in handler.graphs),
                bytes_accessed=sum(g['bytes_accessed']
                                   for g in handler.graphs),
                bytes_by_extent=sum(g['bytes_by_extent']
                                    for g in handler.graphs),
                graphs=handler.graphs)


def run_inductor_counts(models: Dict[str, nn.Module],
                        steps: Sequence[Tuple[str, Sequence[int]]],
                        seed: int = 0, log: Callable[[str], None] = print,
                        freezing: bool = False) -> dict:
    """A row per (step, model): ``count_compiled_step``, and the eager
    step's operations and bytes written (gpu_proxy.count_step, fp32, on
    CPU tensors) under 'eager'. With ``freezing``, each inference step
    also compiled with inductor's freezing, in rows of their own."""
    rows = []
    cases = [(mode, shape, False) for mode, shape in steps]
    if freezing:
        cases += [(mode, shape, True) for mode, shape in steps
                  if mode == 'inference']
    for mode, shape, frozen in cases:
        for name, model in models.items():
            eager = count_step(model, mode, tuple(shape), 'cpu', seed)
            counts = count_compiled_step(model, mode, tuple(shape), seed,
                                         frozen)
            log(f'inductor {mode}{" frozen" if frozen else ""} '
                f'{"x".join(map(str, shape))} {name}: '
                f'{counts["kernels"]} kernels ({counts["extern_kernels"]} '
                f'extern), {counts["bytes_accessed"] / 1e9:.3f} GB read and '
                f'written ({counts["bytes_by_extent"] / 1e9:.3f} GB with '
                f'extern operands by extent), {len(counts["graphs"])} '
                f'graphs; eager '
                f'{eager["ops"]} operations, '
                f'{eager["bytes_written"] / 1e9:.3f} GB written')
            rows.append(dict(model=name, mode=mode, shape=list(shape),
                             freezing=frozen, eager=dict(ops=eager['ops'],
                                        bytes_written=eager['bytes_written']),
                             **counts))
    return dict(backend='inductor', device='cpu', torch=torch.__version__,
                rows=rows)
