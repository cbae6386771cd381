"""The graphs inductor lowers for a compiled step, as FX graphs: after its
own decompositions, joint-graph passes and partition into forward and
backward, stopped before its code generation (seconds instead of
minutes)."""
from __future__ import annotations

from typing import List, Tuple

import torch
from functorch.compile import make_boxed_func


def inductor_forward_graphs(model, x, train: bool
                            ) -> Tuple[List[torch.fx.GraphModule], list]:
    """The forward graphs of ``model``'s step on ``x`` as inductor would
    lower them (they run as FX graphs instead), and the step's outputs.
    ``train``: the step runs a backward of the outputs' sum; else it runs
    without autograd."""
    from torch._inductor.compile_fx import compile_fx

    graphs = []

    def keep_graph(gm, example_inputs, **kwargs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=keep_graph)

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=backend, dynamic=False,
                                 fullgraph=True)
        with torch.set_grad_enabled(train):
            outs = compiled(x)
            if train:
                sum(o.sum() for o in outs).backward()
    finally:
        torch._dynamo.reset()
    # a training graph's forward is compiled first, then its backward
    return (graphs[0::2] if train else graphs), outs
