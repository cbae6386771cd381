"""torch.compile as a user runs it: ``torch.compile(backbone, dynamic=True)``
captures the whole backbone in one graph (no graph break: fullgraph), which
serves every input size without recompiling, with eager's outputs.

The sizes stay on one side of a threshold outside the model: torch's
convolution shape function on the CPU branches on C * H * W > 20480 for
each convolution's input, which recompiles a graph once per side. Within
[210, 280] pixels every convolution of this arch stays on one side.
"""
from __future__ import annotations

import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_

SIZES = ((215, 230), (225, 260), (240, 211), (250, 275), (270, 221),
         (233, 247), (279, 265))


def _max_diff(outs, refs) -> float:
    return max((a - b).abs().max().item() for a, b in zip(outs, refs))


def test_inductor_dynamic_one_graph_for_seven_sizes():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe')).eval()
    compiled = torch.compile(model, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for size in SIZES:
            x = torch.randn(1, 3, *size)
            assert _max_diff(compiled(x), model(x)) <= 1e-4, size
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    assert graphs == 1, f'{graphs} graphs for {len(SIZES)} sizes'


def test_compiled_training_step_matches_eager():
    """Forward and backward through the compiled graph (the lean training
    Function traced by dynamo), at sizes whose maps differ at every level,
    the deepest included: one graph serves them all, with the gradients of
    eager PyTorch."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = randomize_(PosMLP(TINY_ARCH, gate='gqpe', drop_path_rate=0.0,
                              norm_eval=True)).train()
    compiled = torch.compile(model, dynamic=True, fullgraph=True,
                             backend='aot_eager')
    sizes = ((250, 275), (279, 265), (215, 230))
    assert len({(-(-h // 32), -(-w // 32)) for h, w in sizes}) == 3
    for size in sizes:
        x = torch.randn(2, 3, *size)
        grads = []
        for net in (compiled, model):
            model.zero_grad(set_to_none=True)
            sum((o * o).mean() for o in net(x)).backward()
            grads.append({n: p.grad.clone()
                          for n, p in model.named_parameters()})
        for name, grad in grads[0].items():
            ref = grads[1][name]
            scale = ref.abs().max().clamp_min(1e-12)
            assert ((grad - ref).abs().max() / scale) <= 1e-4, (size, name)
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    assert graphs == 1, f'{graphs} graphs for {len(sizes)} sizes'
