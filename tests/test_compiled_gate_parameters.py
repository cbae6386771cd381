"""What a captured graph does with the gates' parameters.

Eager computes a level's mixing weights in one stacked call
(token_mixing.level_mixings): the blocks' parameters are stacked first, in
one operation. Compiled, a stack is a copy per block (inductor lowers a
concatenation as one copy per input: always on a CPU, past eight inputs
on a GPU), and in training its backward stacks the blocks' gradients, a
copy per block again. So a captured graph computes each gate's weights
from its own parameters where it records no backward, and lays out each
block's bias by itself always.

Checked on the graphs inductor's own partitioner produces
(inductor_graphs.py): a ``cat`` whose input is a graph input (a
parameter, under views) is such a copy.
"""
from __future__ import annotations

import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_
from inductor_graphs import inductor_forward_graphs

aten = torch.ops.aten
# operations that hand a tensor on as another view of it (a clone, as the
# stack of one tensor decomposes, is fused into its reader)
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default,
          aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default,
          aten.expand.default, aten.permute.default, aten.clone.default,
          aten.alias.default}


def _concatenated_graph_inputs(graphs):
    """Shapes of the graph inputs that a ``cat`` takes, under views."""
    shapes = []
    for graph in graphs:
        for node in graph.graph.nodes:
            if node.op != 'call_function' or node.target != aten.cat.default:
                continue
            for source in node.args[0]:
                while (source.op == 'call_function'
                       and source.target in _VIEWS):
                    source = source.args[0]
                if source.op == 'placeholder':
                    shapes.append(tuple(source.meta['val'].shape))
    return shapes


def _model(**kwargs):
    torch.manual_seed(0)
    return randomize_(PosMLP(TINY_ARCH, gate='gqpe', **kwargs))


def test_a_captured_inference_graph_stacks_no_parameters():
    """Without autograd, each gate's weights and bias come from its own
    parameters: no parameter is copied into a stack. (Partial windows, so
    that the key scale, which reads the level's weights stacked, is
    computed too.)"""
    model = _model().eval()
    graphs, _ = inductor_forward_graphs(model, torch.randn(1, 3, 97, 161),
                                        train=False)
    assert graphs
    stacked = _concatenated_graph_inputs(graphs)
    assert not stacked, f'graph inputs copied into a stack: {stacked}'


def test_a_captured_training_graph_stacks_no_biases():
    """With autograd the gates' weights are still computed stacked (each
    block's own would add its backward's reductions), but each block's
    bias is laid out by itself."""
    model = _model(drop_path_rate=0.2).train()
    graphs, _ = inductor_forward_graphs(model, torch.randn(2, 3, 97, 161),
                                        train=True)
    assert graphs
    biases = {tuple(block.gate_unit.pos.token_proj_n_bias.shape)
              for level in model.levels for block in level.encoder}
    stacked = _concatenated_graph_inputs(graphs)
    assert stacked, 'the weights are no longer stacked: update this test'
    assert not biases & set(stacked), (
        f'per-query biases {sorted(biases & set(stacked))} copied into a '
        f'stack')


def test_freezing_computes_the_mixing_weights_at_compile_time():
    """Under inductor's freezing (the parameters constants) an inference
    graph computes the gates' weights, softmax included, at compile time:
    no softmax is left to run. (A constant filled in, as masked_fill's
    -inf, would leave everything after it to run.)"""
    model = _model().eval()
    with torch._inductor.config.patch(freezing=True):
        graphs, _ = inductor_forward_graphs(
            model, torch.randn(1, 3, 97, 161), train=False)
    assert graphs
    left = [node.name for graph in graphs for node in graph.graph.nodes
            if node.op == 'call_function' and node.target in (
                aten.amax.default, aten._softmax.default, aten.exp.default)]
    assert not left, f'left to run: {left}'
