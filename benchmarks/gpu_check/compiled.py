"""torch.compile of a PosMLP training step for varying input sizes: the
first call's time, the compiled step against eager (time and result),
and whether further sizes reuse the graph."""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from torch import nn

from ..steps import make_input
from ..timing import interleaved
from .numerics import relative
from .rows import Verdict, ms
from .training import half_channel_loss

# Relative L2 difference allowed between compiled and eager outputs and
# gradients (fp32; the compiled kernels sum in another order and may fuse
# differently).
COMPILE_TOLERANCE = 1e-3


def compiled_step(model: nn.Module, shape: Tuple[int, int, int],
                  device: torch.device, backend: str, warmup: int,
                  repeats: int, seed: int,
                  other_sizes: Sequence[Tuple[int, int]] = (),
                  recompute_views: bool = False,
                  dynamic: Optional[bool] = True) -> Verdict:
    """``model`` (no stochastic depth) in train mode: forward,
    ``half_channel_loss``, backward; then a step at each of
    ``other_sizes``. Under ``dynamic=None`` torch marks a dimension
    dynamic where it first changes, and only there may a size compile a
    graph. ``recompute_views``: torch's workaround for inductor's stride
    order of a saved view at batches above 1 (torch 2.14.1)."""
    with torch._functorch.config.patch(recompute_views=recompute_views):
        return _compiled_step(model, shape, device, backend, warmup,
                              repeats, seed, other_sizes, dynamic)


def _compiled_step(model, shape, device, backend, warmup, repeats, seed,
                   other_sizes, dynamic) -> Verdict:
    model = model.to(device).train()
    batch, h, w = shape
    x = make_input((h, w), batch, device, seed)

    def step(fn):
        model.zero_grad(set_to_none=True)
        outs = fn(x)
        half_channel_loss(outs).backward()
        return [o.detach() for o in outs]

    def grads():
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    eager_outs = step(model)
    eager_grads = grads()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model, backend=backend, dynamic=dynamic)
    stats = torch._dynamo.utils.counters['stats']
    first_call_s, compiled_outs = first_call(lambda: step(compiled), device)
    first_graphs = stats['unique_graphs']     # more than 1: graph breaks
    out_err = max(relative(c, e) for c, e in zip(compiled_outs, eager_outs))
    grad_err = relative(grads(), eager_grads)
    runs = interleaved({'eager': lambda: step(model),
                        'compiled': lambda: step(compiled)},
                       repeats, warmup, device)
    eager_s, compiled_s = (runs[k]['median_s'] for k in ('eager', 'compiled'))
    size_errs, size_first_s, size_graphs = [], [], []
    for h2, w2 in other_sizes:
        before = stats['unique_graphs']
        x = make_input((h2, w2), batch, device, seed)   # what step() reads
        eager_outs = step(model)
        eager_grads = grads()
        seconds, compiled_outs = first_call(lambda: step(compiled), device)
        size_first_s.append(seconds)
        size_graphs.append(stats['unique_graphs'] - before)
        size_errs.append(max(
            max(relative(c, e) for c, e in zip(compiled_outs, eager_outs)),
            relative(grads(), eager_grads)))
    # the sizes that compiled a graph, by index in other_sizes
    new_graph_at = [i for i, n in enumerate(size_graphs) if n]
    allowed = _first_changes(shape[1:], other_sizes) if dynamic is None \
        else []
    graphs = stats['unique_graphs']
    problems = [f'{what} differ by {err:.2e} (limit '
                f'{COMPILE_TOLERANCE:.0e})'
                for what, err in (('outputs', out_err),
                                  ('gradients', grad_err),
                                  ('other sizes', max(size_errs, default=0)))
                if not err <= COMPILE_TOLERANCE]
    if first_graphs != 1:
        problems.append(f'{first_graphs} graphs at the first size (graph '
                        f'breaks)')
    if not set(new_graph_at) <= set(allowed):
        problems.append(f'{graphs} graphs for {1 + len(other_sizes)} sizes '
                        f'(recompiled at ' + ', '.join(
                            'x'.join(map(str, other_sizes[i]))
                            for i in new_graph_at) + ')')
    detail = (f'backend {backend}, dynamic={dynamic}: first call (compile '
              f'+ run) {first_call_s:.1f} s; step eager {ms(eager_s)}, '
              f'compiled {ms(compiled_s)} ({compiled_s / eager_s:.2f}x; '
              f'median of {repeats} after {warmup} warm-up); compiled '
              f'against eager: outputs {out_err:.1e}, gradients '
              f'{grad_err:.1e}; '
              f'{1 + len(other_sizes)} sizes in {graphs} graph(s), first '
              f'call at a further size {max(size_first_s, default=0):.2f} s '
              f'at most')
    if problems:
        detail = '; '.join(problems) + '. ' + detail
    return Verdict(not problems, detail, dict(
        backend=backend, dynamic=dynamic, shape=list(shape),
        first_call_s=first_call_s,
        eager_median_s=eager_s, compiled_median_s=compiled_s,
        eager_times=runs['eager']['times'],
        compiled_times=runs['compiled']['times'],
        output_difference=out_err, gradient_difference=grad_err,
        graphs=graphs, other_sizes=[list(s) for s in other_sizes],
        other_size_first_call_s=size_first_s,
        other_size_new_graphs=size_graphs,
        other_size_difference=size_errs))


def first_call(call, device: torch.device):
    """(seconds, result) of one call: a compile and its first run."""
    result = []
    runs = interleaved({'first call': lambda: result.append(call())}, 1, 0,
                       device)
    return runs['first call']['median_s'], result[0]


def _first_changes(first: Sequence[int], sizes: Sequence[Tuple[int, int]]
                   ) -> list:
    """Indices in ``sizes`` where the height, or the width, first differs
    from ``first``'s: where automatic dynamic shapes compiles again."""
    return sorted({next(i for i, size in enumerate(sizes)
                        if size[dim] != first[dim])
                   for dim in (0, 1)
                   if any(size[dim] != first[dim] for size in sizes)})
