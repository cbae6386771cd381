"""Exporters and tracers: one graph that is right at every input size.

Each exporter captures the model once, at one size, with dynamic height and
width; the captured graph is then run at other sizes (untiled ones, and one
whose deepest map is smaller than a window) and compared with eager PyTorch.
Exporters that cannot be supported (TorchScript tracing, the legacy ONNX
exporter built on it) must raise at export time instead of writing a graph
that only holds at the traced size.
"""
from __future__ import annotations

import io

import pytest
import torch
import torch.fx.experimental._config as fx_config
from torch.export import Dim

from posmlp_dense import PosMLP
from posmlp_dense.forward_mode import UnsupportedExportError

from conftest import randomize_

# Small windows keep the test fast and make every level's windows partial at
# the sizes below; two blocks at level 1 exercise a level's block loop.
ARCH = dict(embed_dims=(16, 32, 64, 128), depths=(1, 2, 1, 1),
            mlp_ratio=(4, 4, 4, 2), gamma=(2, 4, 8, 8),
            window_size=(5, 4, (3, 5), 3))
SGU_ARCH = dict(ARCH, gamma=(1, 1, 1, 1))
GATES = ('gqpe', 'lrpe', 'sgu')

EXPORT_SIZE = (160, 224)
# untiled at every level; level 2 and 3 maps smaller than their windows
# (one partial window each); another aspect ratio, untiled
RUN_SIZES = ((97, 131), (40, 52), (150, 70))
TOL = 5e-5


def _model(gate: str) -> PosMLP:
    arch = SGU_ARCH if gate == 'sgu' else ARCH
    torch.manual_seed(0)
    return randomize_(PosMLP(arch, gate=gate, drop_path_rate=0.0)).eval()


def _eager(model, x):
    with torch.no_grad():
        return model(x)


def _dynamic_shapes():
    # an exported program needs every level's map at least 2 wide: a
    # deepest map of one column or row (a side <= 32 pixels) is refused by
    # its guards
    return ({2: Dim('height', min=33, max=4096),
             3: Dim('width', min=33, max=4096)},)


def _max_diff(outs, refs) -> float:
    assert len(outs) == len(refs)
    worst = 0.0
    for out, ref in zip(outs, refs):
        out = torch.as_tensor(out)
        assert out.shape == ref.shape
        worst = max(worst, (out - ref).abs().max().item())
    return worst


@pytest.mark.parametrize('gate', ('gqpe', 'lrpe'))
def test_torch_export_dynamic_size_matches_eager_at_other_sizes(gate):
    model = _model(gate)
    example = torch.randn(1, 3, *EXPORT_SIZE)
    program = torch.export.export(model, (example,),
                                  dynamic_shapes=_dynamic_shapes())
    exported = program.module()
    for size in ((97, 131), (150, 70), (300, 200)):
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            diff = _max_diff(exported(x), _eager(model, x))
        assert diff <= TOL, (gate, size, diff)
    # A map that fits one window at some level: the window layout's views
    # keep window counts merged with other dimensions, so the program has
    # no guard on them, and takes such maps with eager's numbers
    small = torch.randn(1, 3, *RUN_SIZES[1])
    assert _max_diff(exported(small), _eager(model, small)) <= TOL


@pytest.mark.parametrize('gate', GATES)
def test_size_oblivious_export_matches_eager(gate):
    """A program captured with size-oblivious tracing (which the SGU gate
    needs: the tracer cannot prove its levels' maps taller than one token)
    takes every size, with eager's numbers."""
    model = _model(gate)
    example = torch.randn(1, 3, *EXPORT_SIZE)
    with fx_config.patch(backed_size_oblivious=True):
        program = torch.export.export(model, (example,),
                                      dynamic_shapes=_dynamic_shapes())
    for size in RUN_SIZES:
        x = torch.randn(1, 3, *size)
        with torch.no_grad():
            diff = _max_diff(program.module()(x), _eager(model, x))
        assert diff <= TOL, (gate, size, diff)


# GQPE's file is made and checked in ONNX Runtime by tools/export.py in
# test_export_tool.py (backbone_export: verified at three sizes, partial and
# single windows among them, and run at a fourth); the two other gates here
@pytest.mark.parametrize('gate', ('lrpe', 'sgu'))
def test_onnx_dynamo_export_runs_in_onnxruntime_at_other_sizes(gate, tmp_path):
    ort = pytest.importorskip('onnxruntime')
    pytest.importorskip('onnxscript')
    model = _model(gate)
    path = tmp_path / f'posmlp_{gate}.onnx'
    example = torch.randn(1, 3, *EXPORT_SIZE)
    torch.onnx.export(model, (example,), str(path), dynamo=True,
                      input_names=['image'],
                      dynamic_shapes=_dynamic_shapes(), verbose=False)
    session = ort.InferenceSession(str(path),
                                   providers=['CPUExecutionProvider'])
    name = session.get_inputs()[0].name
    for size in (EXPORT_SIZE,) + RUN_SIZES:
        x = torch.randn(1, 3, *size)
        outs = session.run(None, {name: x.numpy()})
        diff = _max_diff(outs, _eager(model, x))
        assert diff <= TOL, (gate, size, diff)


@pytest.mark.parametrize('dynamic_axes', [None, {'image': {2: 'h', 3: 'w'}}])
def test_legacy_onnx_exporter_refuses_with_the_supported_route(dynamic_axes):
    model = _model('gqpe')
    with pytest.raises(Exception) as info:
        torch.onnx.export(model, (torch.randn(1, 3, 64, 64),), io.BytesIO(),
                          dynamo=False, input_names=['image'],
                          dynamic_axes=dynamic_axes)
    # the exporter may wrap our error; its message must survive
    text = ''.join(str(e) for e in _chain(info.value))
    assert 'dynamo=True' in text and 'traced size' in text


def test_jit_trace_refuses():
    model = _model('lrpe')
    with pytest.raises(UnsupportedExportError, match='torch.export'):
        torch.jit.trace(model, torch.randn(1, 3, 64, 64))


def _chain(exc):
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


@pytest.mark.parametrize('gate', GATES)
def test_fx_feature_extraction(gate):
    """timm's FX feature path (symbolic tracing through the whole model)
    gives eager's maps at an untiled size."""
    from timm.models._features_fx import create_feature_extractor
    model = _model(gate)
    nodes = {f'levels.{i}': f'level{i}' for i in range(4)}
    extractor = create_feature_extractor(model, return_nodes=nodes).eval()
    x = torch.randn(2, 3, 97, 131)
    with torch.no_grad():
        feats = extractor(x)
        ref = model.forward_intermediates(x, output_fmt='NHWC',
                                          intermediates_only=True)
    assert list(feats) == [f'level{i}' for i in range(4)]
    assert _max_diff([feats[f'level{i}'] for i in range(4)], ref) <= TOL


@pytest.mark.slow
def test_compile_dynamic_runs_across_sizes_without_recompiling():
    """torch.compile(dynamic=True) runs at three untiled sizes with eager's
    results and compiles one graph for all of them.

    Under --slow: the default run checks the same in
    test_compile.py::test_inductor_dynamic_one_graph_for_seven_sizes (the
    same capture, fullgraph and dynamic=True, through inductor's code
    generation as well, one graph for seven untiled sizes, eager's outputs).

    Two things outside the model's control do recompile: torch's conv shape
    function branches on C*H*W > 20480 for each conv's input (with this
    arch, images on both sides of about 300x300 pixels), and a size where
    some level fits one window (the tracer's contiguity guard, see
    test_torch_export_...). The sizes below stay on one side of both."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # (reset() keeps the counters)
    model = _model('gqpe')
    compiled = torch.compile(model, dynamic=True, backend='aot_eager',
                             fullgraph=True)
    with torch.no_grad():
        for size in ((301, 311), (347, 290), (330, 410)):
            x = torch.randn(1, 3, *size)
            assert _max_diff(compiled(x), _eager(model, x)) <= TOL, size
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    assert graphs == 1, f'{graphs} graphs compiled for 3 sizes'


def test_eager_modes_agree_with_the_graph_mode():
    """The window layout of a captured graph (gathers) computes what eager
    mode's (views of a padded map) computes, in train mode too (with the
    same stochastic-depth draws)."""
    from posmlp_dense.forward_mode import ForwardMode
    for gate in GATES:
        model = _model(gate)
        x = torch.randn(2, 3, 97, 131)
        eager = _eager(model, x)
        model.forward_mode = lambda _: ForwardMode(autograd=False, graph=True)
        assert _max_diff(_eager(model, x), eager) <= TOL, gate
        model.train()
        torch.manual_seed(5)
        graph_train = model(x)
        del model.forward_mode
        torch.manual_seed(5)
        assert _max_diff(model(x), [y.detach() for y in graph_train]) <= TOL
