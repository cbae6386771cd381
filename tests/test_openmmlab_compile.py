"""The OpenMMLab models under torch.compile: the optimizer step a
config's ``compile=True`` traces, the demo detector's features in one
graph for every size, and CompileBackboneHook in a real training run."""
from __future__ import annotations

import uuid

import pytest
import torch

pytest.importorskip('mmdet')

from mmengine.config import Config  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from openmmlab_runs import (DEMO_DET, models_registry,  # noqa: E402
                            small_run_cfg, write_demo_data)


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    return write_demo_data(tmp_path_factory.mktemp('demo_data'))


@pytest.mark.parametrize('constructor', [
    'PlainGroupsOptimWrapperConstructor', 'DefaultOptimWrapperConstructor'])
def test_shipped_parameter_groups_let_dynamo_trace_the_optimizer_step(
        constructor):
    """The shipped schedules' constructor gives mmengine's groups as plain
    dicts, so that a compiled train_step (a config's compile=True) traces
    the optimizer step; mmengine's own constructor, with the same
    paramwise_cfg, gives ConfigDicts, at which dynamo stops (torch
    2.14.1)."""
    from mmengine.optim import build_optim_wrapper
    import posmlp_dense.openmmlab.runtime  # noqa: F401  (registers)
    cfg = Config.fromfile(DEMO_DET)
    assert cfg.optim_wrapper.constructor == \
        'PlainGroupsOptimWrapperConstructor'
    cfg.optim_wrapper.constructor = constructor
    model = models_registry(cfg).build(cfg.model)
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    reference = build_optim_wrapper(model, dict(
        cfg.optim_wrapper, constructor='DefaultOptimWrapperConstructor')
        ).optimizer.param_groups
    groups = optimizer.param_groups
    assert [{k: v for k, v in g.items() if k != 'params'} for g in groups] \
        == [{k: v for k, v in g.items() if k != 'params'} for g in reference]
    assert [g['params'] for g in groups] == [g['params'] for g in reference]

    for p in model.parameters():
        p.grad = torch.ones_like(p)
    torch._dynamo.reset()
    step = torch.compile(optimizer.step, backend='eager')
    if constructor == 'PlainGroupsOptimWrapperConstructor':
        step()
    else:
        with pytest.raises(Exception, match='UserDefinedDictVariable'):
            step()


def test_demo_detector_features_compile_in_one_graph_for_seven_sizes():
    """The demo RetinaNet's backbone and FPN (``extract_feat``) under
    ``torch.compile(dynamic=True, fullgraph=True)`` in train mode: no graph
    break, one graph for seven input sizes, eager's features and gradients.
    (mmengine's ``compile=True`` compiles the whole ``train_step``, whose
    mmdet head and loss code breaks graphs on its own; the backbone is
    traced as part of it as here.) The sizes keep every convolution on one
    side of torch's CPU shape-function threshold (C * H * W > 20480), which
    would otherwise compile a second graph outside the backbone."""
    cfg = Config.fromfile(DEMO_DET)
    model = models_registry(cfg).build(cfg.model).train()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(model.extract_feat, dynamic=True,
                             fullgraph=True, backend='aot_eager')
    sizes = ((192, 256), (224, 256), (208, 288), (240, 240), (200, 320),
             (232, 272), (256, 288))
    named = [(n, p) for n, p in model.backbone.named_parameters()
             if p.requires_grad]
    params = [p for _, p in named]
    # the stem's convolution biases feed training-mode BatchNorms, which
    # subtract them again: their gradients are zero but for rounding, in
    # both runs alike, and are held to that
    zero = [n.startswith('patch_embed.projs.') and n.endswith('.bias')
            for n, _ in named]
    assert any(zero)
    for h, w in sizes:
        x = torch.randn(2, 3, h, w)
        results = []
        for fn in (compiled, model.extract_feat):
            feats = fn(x)
            grads = torch.autograd.grad(sum((f * f).mean() for f in feats),
                                        params)
            results.append(([f.detach() for f in feats], grads))
        (feats, grads), (ref_feats, ref_grads) = results
        for a, b in zip(feats, ref_feats):
            assert (a - b).abs().max() <= 1e-4 * b.abs().max(), (h, w)
        largest = max(b.abs().max() for b in ref_grads)
        for a, b, is_zero in zip(grads, ref_grads, zero):
            if is_zero:
                assert max(a.abs().max(), b.abs().max()) <= 1e-5 * largest
            else:
                assert (a - b).abs().max() <= 1e-4 * b.abs().max().clamp_min(
                    1e-12), (h, w)
    graphs = torch._dynamo.utils.counters['stats']['unique_graphs']
    assert graphs == 1, f'{graphs} graphs for {len(sizes)} sizes'


def _hooked_run_cfg(data_root, work_dir, custom_hooks, compile_cfg=None):
    """The demo detector for one epoch of eight iterations of one image at
    a random one of four scales, without validation."""
    cfg = small_run_cfg(DEMO_DET, data_root, work_dir, length=1)
    cfg.train_dataloader.batch_size = 1
    pipeline = cfg.train_dataloader.dataset.pipeline
    resize = next(i for i, t in enumerate(pipeline) if t.type == 'Resize')
    pipeline[resize] = dict(type='RandomChoiceResize', keep_ratio=True,
                            scales=[(192, 128), (256, 192), (320, 224),
                                    (384, 288)])
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator'):
        cfg[key] = None
    cfg.default_hooks.checkpoint.interval = 10 ** 6
    cfg.custom_hooks = custom_hooks
    cfg.compile = compile_cfg
    return cfg


def test_compile_backbone_hook_compiles_the_backbone_once(data_root,
                                                          tmp_path):
    """``CompileBackboneHook`` in a real training run: the backbone alone
    is compiled, once for every input size of the run (dynamic=True), in
    place (the checkpoint keeps eager's keys), and the run's losses are
    eager's. With the config's own ``compile`` also set, it refuses."""
    from mmengine.hooks import Hook

    import posmlp_dense.openmmlab.runtime  # noqa: F401  (registers)
    frames = []

    def backend(gm, example_inputs):
        trace = torch._guards.CompileContext.current_trace_id()
        modules = {path.split('.')[0] for node in gm.graph.nodes
                   for path, _ in node.meta.get('nn_module_stack',
                                                {}).values()}
        frames.append((str(trace.compile_id), sorted(modules)))
        return torch._dynamo.lookup_backend('aot_eager')(gm, example_inputs)

    name = f'counting_{uuid.uuid4().hex[:8]}'  # by name: configs are text
    torch._dynamo.register_backend(backend, name=name)

    class Record(Hook):
        def __init__(self):
            self.losses, self.sizes = [], set()

        def after_train_iter(self, runner, batch_idx, data_batch=None,
                             outputs=None):
            self.losses.append({k: float(v) for k, v in outputs.items()})
            # as the backbone sees them: padded to a multiple of 32
            self.sizes.add(tuple(
                -(-max(t.shape[i] for t in data_batch['inputs']) // 32) * 32
                for i in (1, 2)))

    runs = {}
    for kind, hooks in (('eager', []), ('hooked', [dict(
            type='CompileBackboneHook', backend=name, dynamic=True)])):
        torch._dynamo.reset()
        runner = Runner.from_cfg(_hooked_run_cfg(data_root, tmp_path / kind,
                                                 hooks))
        record = Record()
        runner.register_hook(record)
        runner.train()
        runs[kind] = record, runner.model.state_dict()
    (eager, eager_state), (hooked, hooked_state) = (runs['eager'],
                                                    runs['hooked'])
    assert len(hooked.sizes) >= 3, hooked.sizes  # sizes the graph must fit
    # one frame, the backbone's, compiled once (dynamo may hand its graph
    # over again after a restart that specializes float attributes)
    assert {frame for frame, _ in frames} == {'0/0'}, frames
    assert all(modules == ["L['self']"] or not modules
               for _, modules in frames), frames
    assert list(hooked_state) == list(eager_state)
    assert hooked.sizes == eager.sizes
    for ours, ref in zip(hooked.losses, eager.losses):
        for key in ref:
            assert abs(ours[key] - ref[key]) <= 1e-4 * abs(ref[key]), key

    cfg = _hooked_run_cfg(data_root, tmp_path / 'both', [dict(
        type='CompileBackboneHook')], compile_cfg=dict(backend='eager'))
    with pytest.raises(ValueError, match='both compile the backbone'):
        Runner.from_cfg(cfg).train()
