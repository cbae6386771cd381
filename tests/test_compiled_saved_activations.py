"""What a compiled training step keeps for its backward.

The lean training Function (block_function.py) keeps a block's
pre-activation h and recomputes GELU(h) in its backward. Under
torch.compile, AOT autograd merges that recomputed GELU with the forward's
(the same operation on the same input), and its partitioner then decides
whether the backward gets the activations saved or recomputes them. The
activations are as large as h itself, so saving them would add 2K values
per token and block to what the step keeps, and a kernel that writes them.

Checked on the graphs inductor's own partitioner produces
(inductor_graphs.py).
"""
from __future__ import annotations

import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_
from inductor_graphs import inductor_forward_graphs


def _saved_shapes(forward_graph):
    """Shapes of what the forward hands the backward (and returns)."""
    output = next(n for n in forward_graph.graph.nodes if n.op == 'output')
    return [tuple(n.meta['val'].shape) for n in output.args[0]
            if isinstance(getattr(n, 'meta', {}).get('val'), torch.Tensor)
            and n.op != 'placeholder']


def test_compiled_training_recomputes_the_blocks_activations():
    """No forward graph saves a block's GELU activations, which the lean
    Function recomputes from h: shaped (2, K, B, H, W), the (u, v) halves
    as its backward views them. They were saved while the backward took
    the halves apart with ``unbind``, an operator the partitioner does not
    count as fusible, so it would not recompute what feeds it."""
    torch.manual_seed(0)
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe', drop_path_rate=0.2))
    model.train()
    x = torch.randn(3, 3, 224, 224)
    graphs, outs = inductor_forward_graphs(model, x, train=True)
    assert graphs
    activations = set()
    for level, out in zip(model.levels, outs):
        B, _, H, W = out.shape
        for block in level.encoder:
            K = block.proj_c_e.out_features // 2
            activations.add((2, K, B, H, W))
    saved = [s for g in graphs for s in _saved_shapes(g)]
    kept = [s for s in saved if s in activations]
    assert not kept, (
        f'the compiled forward saves GELU activations {kept} for the '
        f'backward, which should recompute them from h')
