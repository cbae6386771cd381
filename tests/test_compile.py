"""torch.compile as a user runs it: ``torch.compile(backbone)`` captures
the whole backbone in one graph (no graph break: fullgraph), which serves
every input size without recompiling, with eager's outputs and gradients.

Inference, with ``dynamic=True``: one graph for seven sizes. The sizes stay
on one side of a threshold outside the model: torch's convolution shape
function on the CPU branches on C * H * W > 20480 for each convolution's
input, which recompiles a graph once per side. Within [210, 280] pixels
every convolution of this arch stays on one side.

Training: one graph for seven sizes under ``dynamic=True``; under the
default ``dynamic=None`` a second, which marks the sizes dynamic. A
training step's convolutions are opaque operators (conv_function.py), so no
convolution threshold applies; with inductor on a CPU, its C++ code
generation branches on B * ceil(H/4) * ceil(W/4) > 4096 (the stem map's
pixels), so the inductor case keeps its sizes above it.
"""
from __future__ import annotations

import copy

import pytest
import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_

SIZES = ((215, 230), (225, 260), (240, 211), (250, 275), (270, 221),
         (233, 247), (279, 265))


def _max_diff(outs, refs) -> float:
    return max((a - b).abs().max().item() for a, b in zip(outs, refs))


@pytest.mark.parametrize('vectorized', [
    False, pytest.param(True, marks=pytest.mark.slow)])
def test_inductor_dynamic_one_graph_for_seven_sizes(vectorized):
    """Inductor's C++ code generation, one graph for seven sizes. The
    default run generates scalar loops (no SIMD ISA): the same lowering,
    scheduling and loop code, whose size checks (e.g. a float32 sum's
    chunked accumulation when its length may exceed 4096) the scalar
    kernels make too. The vectorized case adds the tiling analysis, which
    asks sympy.simplify about every index with symbolic sizes and so takes
    three times as long (six minutes on a 2-core CPU): it runs under
    --slow."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe')).eval()
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    # simdlen None: the CPU's own ISA; 1 bit matches no ISA: scalar code
    isa = dict() if vectorized else {'cpp.simdlen': 1}
    with torch.no_grad(), torch._inductor.config.patch(isa):
        for size in SIZES:
            x = torch.randn(1, 3, *size)
            assert _max_diff(compiled(x), model(x)) <= 1e-4, size
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    assert graphs == 1, f'{graphs} graphs for {len(SIZES)} sizes'


# Training sizes: maps differ at every level; the deepest level is smaller
# than its window (7) for the first four (H or W <= 192); for inductor at
# batch 2, B * ceil(H/4) * ceil(W/4) > 4096 throughout (see above)
TRAIN_SIZES = ((190, 230), (185, 262), (210, 199), (247, 186), (257, 271),
               (231, 244), (269, 215))


def _relative_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def _check_training_compiles_once(backend, batch, dynamic, graphs_allowed,
                                  dtype=torch.float32):
    """Each size's compiled step against eager's: outputs within 1e-4
    (relative L2), and every parameter's gradient within 1e-4 of a float64
    eager step's, or as close as eager's own (twice its distance): some
    gradients (GQPE's at init, the sum of many near-cancelling terms) carry
    a few 1e-4 of float32 rounding in eager too, which a compiled step's
    other order of operations rounds differently. Dynamo may compile no
    more graphs than ``graphs_allowed``: a further one fails at once
    (fail_on_recompile_limit_hit) rather than after minutes."""
    assert len({(-(-h // 32), -(-w // 32)) for h, w in TRAIN_SIZES}) == 7
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe', drop_path_rate=0.0,
                              norm_eval=True)).to(dtype).train()
    exact = copy.deepcopy(model).double()
    compiled = torch.compile(model, dynamic=dynamic, fullgraph=True,
                             backend=backend)
    gen = torch.Generator().manual_seed(0)
    with torch._dynamo.config.patch(recompile_limit=graphs_allowed,
                                    fail_on_recompile_limit_hit=True):
        for size in TRAIN_SIZES:
            x = torch.randn(batch, 3, *size, generator=gen).to(dtype)
            results = []
            for net, owner, inp in ((compiled, model, x), (model, model, x),
                                    (exact, exact, x.double())):
                owner.zero_grad(set_to_none=True)
                outs = net(inp)
                sum((o * o).mean() for o in outs).backward()
                results.append(([o.detach() for o in outs],
                                {n: p.grad.double()
                                 for n, p in owner.named_parameters()}))
            (outs, grads), (ref_outs, ref_grads), (_, exact_grads) = results
            for out, ref in zip(outs, ref_outs):
                assert _relative_l2(out, ref) <= 1e-4, size
            for name, grad in grads.items():
                eager_error = _relative_l2(ref_grads[name], exact_grads[name])
                assert _relative_l2(grad, exact_grads[name]) <= max(
                    1e-4, 2 * eager_error), (size, name)
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    assert graphs == graphs_allowed, (
        f'{graphs} graphs for {len(TRAIN_SIZES)} sizes')


@pytest.mark.slow
@pytest.mark.parametrize('batch, dynamic, graphs', [
    (1, True, 1), (2, True, 1), (1, None, 2), (2, None, 2)])
def test_training_step_graph_serves_every_size(batch, dynamic, graphs):
    """Graph capture and autograd's default partition (aot_eager: no code
    generation), at batch 1 and 2, under dynamic=True and the default.
    Under --slow: the graph-pass test below runs the same capture through
    inductor's decompositions and partition, in every case."""
    _check_training_compiles_once('aot_eager', batch, dynamic, graphs)


def _inductor_graph_passes(saved_views: list):
    """A backend with inductor's decompositions and joint-graph passes
    (pattern rewrites, partition) but no code generation: the guards those
    passes add, in seconds rather than the minutes of inductor's C++. Each
    forward graph's saved views whose strides inductor could not order
    (``_unorderable_saved_views``) are added to ``saved_views``."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._inductor.compile_fx import partition_fn
    from torch._inductor.decomposition import select_decomp_table

    def forward_compiler(gm, example_inputs):
        saved_views.extend(_unorderable_saved_views(gm))
        return boxed_nop(gm, example_inputs)

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=boxed_nop,
                        partition_fn=partition_fn,
                        decompositions=select_decomp_table())


@pytest.mark.parametrize('batch, dynamic, graphs', [
    (1, True, 1), (2, None, 2),
    pytest.param(2, True, 1, marks=pytest.mark.slow),
    pytest.param(1, None, 2, marks=pytest.mark.slow)])
def test_inductor_graph_passes_add_no_size_guard(batch, dynamic, graphs):
    """Inductor's joint-graph passes on the training step guard on no
    size: e.g. its pointless-view pass once compared a window layout's
    windows * N with N, which recompiled at batch 1 for an input with one
    window at a level (the fourth size). In float64, as the inductor case
    below: its decompositions change the summation order. The default run
    keeps batch 1 under dynamic=True (that failure) and batch 2 under
    dynamic=None (the second graph, and a batch above 1); the other two
    cases run under --slow.

    The same graphs save no view whose strides inductor cannot order. In
    a detector, the neck's convolutions join the backbone's graph, and on
    a CPU inductor then lays 4-D tensors out channels-last. A view saved
    for the backward with such a layout has strides like (C * B * H * W,
    1, C * W, C), whose order sympy cannot settle for symbolic sizes, and
    inductor stopped at the first iteration of mmengine's compile. The
    gate's output and the downsampling's convolution save no 4-D view."""
    saved_views = []
    _check_training_compiles_once(_inductor_graph_passes(saved_views),
                                  batch, dynamic, graphs, torch.float64)
    assert not saved_views, saved_views


# the operators whose result inductor lowers as a view of their input
VIEW_OPS = ('view', '_unsafe_view', 'reshape', 'permute', 'transpose',
            'expand', 'slice', 'select', 'unsqueeze', 'squeeze', 'alias',
            'as_strided', 'narrow', 'unfold', 'diagonal', 't')


def _unorderable_saved_views(fw_module) -> list:
    """The forward's outputs (what the backward is given) that inductor
    would lower as views and whose strides, in the channels-last layout it
    gives a 4-D tensor next to a convolution on a CPU (graph.py
    ``nodes_prefer_channels_last``), it cannot order: ``get_stride_order``
    then raises (symbolic sizes; pytorch issues 185510, 172204)."""
    from torch._inductor.ir import FlexibleLayout
    from torch._inductor.utils import argsort

    def expr(size):
        return size.node.expr if isinstance(size, torch.SymInt) else size

    found = []
    output = next(n for n in fw_module.graph.nodes if n.op == 'output')
    for node in output.args[0]:
        val = getattr(node, 'meta', {}).get('val')
        op = getattr(getattr(node, 'target', None), 'overloadpacket', None)
        # 4-D only: the channels-last layout is given to no other rank
        if not isinstance(val, torch.Tensor) or val.dim() != 4 or \
                op is None or op.__name__ not in VIEW_OPS:
            continue
        strides = FlexibleLayout.stride_ordered_for_memory_format(
            [expr(s) for s in val.shape], torch.channels_last)
        try:
            argsort(strides)
        except TypeError:
            trace = (node.meta.get('stack_trace') or '').strip()
            found.append(trace.splitlines()[-2:])
    return found


@pytest.mark.slow
@pytest.mark.parametrize('batch, dynamic, graphs', [
    (2, True, 1), (1, True, 1), (1, None, 2), (2, None, 2)])
def test_inductor_training_step_compiles_once(batch, dynamic, graphs):
    """Inductor itself, as a user runs it, with no torch setting: the
    forward and backward compile once for seven sizes (under the default
    dynamic=None, once more at the second size, which marks the sizes
    dynamic). In float64, so that the comparison with eager is about the
    graph, not summation order: in float32 the gradient of GQPE's centres,
    of order 1e-8, differs by 1.4e-4 (relative L2), as eager at one thread
    against eager at two differs by 6e-5.

    Each case takes 8 to 20 minutes on a 2-core CPU, most of it in
    sympy.simplify called by inductor's C++ vectorization analysis, so
    all four need ``pytest --slow`` (``make test-slow``). The default run
    guards what they catch more cheaply: the graph-pass test above (the
    guards of inductor's decompositions and partition, all four cases, and
    the saved views whose stride order inductor's lowering could not
    settle), and the inference case (inductor's code generation, in
    scalar loops, one graph for seven sizes)."""
    _check_training_compiles_once('inductor', batch, dynamic, graphs,
                                  torch.float64)
