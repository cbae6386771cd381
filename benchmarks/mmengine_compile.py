"""mmengine's ``compile`` on the demo RetinaNet, as a config asks for it
(docs/performance.md, "mmengine compile on the demo RetinaNet"):

    python -m benchmarks.mmengine_compile --form true|dict|backbone \
        [--backend inductor] [--iters 8] [--without-mkldnn] --json PATH

A few iterations of two images at seven input scales with the runner's
``compile`` set (``true``: torch.compile's defaults; ``dict``:
``dynamic=True``) or, for ``backbone``, ``CompileBackboneHook`` alone: the
graphs dynamo compiles and the modules each holds, graph breaks,
recompilations, and the first iteration's losses against an eager run.
``tools/benchmark.py render`` writes the JSON files' table.
"""
from __future__ import annotations

import argparse
import collections
import json
import os.path as osp
import tempfile
import time

import torch


CONFIG = 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py'
# (w, h), keep-ratio: every batch pads to a different multiple of 32
SCALES = [(256, 192), (288, 224), (320, 240), (224, 160), (352, 256),
          (240, 208), (272, 176)]


class CountingBackend:
    """A torch.compile backend that notes the modules of each graph dynamo
    hands it, then compiles it with ``backend``. A frame traced again
    (under ``dynamic=True``, to specialize float attributes) replaces its
    earlier graph, which never runs and goes to ``abandoned``."""

    def __init__(self, backend: str, root: str | None = None):
        self.backend = backend
        self.root = root  # the module compiled by itself, if not the model
        self.graphs = []
        self.abandoned = []

    def __call__(self, gm, example_inputs):
        # module paths as dynamo writes them: "L['self'].backbone.levels..."
        # ("L['self'].levels..." where the backbone is compiled by itself)
        modules = sorted({
            self.root or path.split('.')[1] for node in gm.graph.nodes
            for path, _ in node.meta.get('nn_module_stack', {}).values()
            if self.root or '.' in path})
        trace = torch._guards.CompileContext.current_trace_id()
        frame = str(trace.compile_id) if trace else None
        graph = dict(modules=modules, nodes=len(gm.graph.nodes),
                     backbone='backbone' in modules, frame=frame,
                     attempt=trace.attempt if trace else 0)
        for i, earlier in enumerate(self.graphs):
            if frame is not None and earlier['frame'] == frame:
                self.abandoned.append(self.graphs.pop(i))
                break
        self.graphs.append(graph)
        return torch._dynamo.lookup_backend(self.backend)(gm, example_inputs)


def _build_runner(work_dir: str, iters: int, compile_cfg, graphs=(),
                  custom_hooks=()):
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    import posmlp_dense.openmmlab.runtime  # noqa: F401  (registers)

    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = work_dir
    pipeline = cfg.train_dataloader.dataset.pipeline
    resize = next(i for i, t in enumerate(pipeline) if t.type == 'Resize')
    pipeline[resize] = dict(type='RandomChoiceResize', scales=SCALES,
                            keep_ratio=True)
    cfg.train_dataloader.update(batch_size=2, num_workers=0,
                                persistent_workers=False)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=iters,
                         val_interval=10 ** 9)
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook',
                                        interval=10 ** 9)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    for key in ('val', 'test'):
        cfg[f'{key}_dataloader'] = cfg[f'{key}_cfg'] = None
        cfg[f'{key}_evaluator'] = None
    cfg.compile = compile_cfg
    cfg.custom_hooks = list(custom_hooks)
    runner = Runner.from_cfg(cfg)

    class Record(Hook):
        def __init__(self):
            self.losses, self.shapes, self.graphs = [], [], []

        def after_train_iter(self, runner, batch_idx, data_batch=None,
                             outputs=None):
            self.losses.append({k: float(v) for k, v in outputs.items()})
            self.shapes.append([list(t.shape[1:])
                                for t in data_batch['inputs']])
            self.graphs.append(len(graphs))

    record = Record()
    runner.register_hook(record)
    return runner, record


def _recompiles_by_function(log_lines):
    counts = collections.Counter()
    for line in log_lines:
        if 'Recompiling function' in line:
            function = line.split('Recompiling function ', 1)[1]
            # 'fn in /.../site-packages/pkg/x.py:12' -> 'fn in pkg/x.py:12'
            name, _, path = function.splitlines()[0].strip().partition(' in ')
            counts[f"{name} in {path.split('site-packages/')[-1]}"] += 1
    return dict(counts.most_common())


def _failure(err: BaseException, counting: CountingBackend,
             iteration: int) -> dict:
    """What stopped a compiled run, and the graph dynamo last handed the
    backend."""
    message = str(err).strip().splitlines()
    last = counting.graphs[-1] if counting.graphs else {}
    return dict(iteration=iteration, error=type(err).__name__,
                message=message[-1][:400] if message else '',
                graph_frame=last.get('frame'),
                graph_modules=last.get('modules'))


def run(form: str, backend: str, iters: int,
        mkldnn: bool = True) -> dict:
    import logging
    counting = CountingBackend(backend,
                               root='backbone' if form == 'backbone' else None)
    # by name: mmengine writes the config out as text
    name = f'posmlp_counting_{backend}'
    torch._dynamo.register_backend(counting, name=name)
    hooks = []
    if form == 'true':
        compile_cfg = dict(backend=name)
    elif form == 'dict':
        compile_cfg = dict(backend=name, dynamic=True)
    else:
        compile_cfg = None
        hooks = [dict(type='CompileBackboneHook', backend=name, dynamic=True)]
    with tempfile.TemporaryDirectory() as tmp, \
            torch.backends.mkldnn.flags(enabled=mkldnn):
        start = time.time()
        print(f'eager: 1 iteration of {CONFIG}')
        runner, eager = _build_runner(osp.join(tmp, 'eager'), 1, None)
        runner.train()
        print(f'compiled ({form}, {backend}): {iters} iterations')
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        lines = []  # the recompilation messages
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())
        recompiles = logging.getLogger('torch._dynamo.guards')
        torch._logging.set_logs(recompiles=True)
        recompiles.addHandler(handler)
        try:
            runner, compiled = _build_runner(osp.join(tmp, 'compiled'),
                                             iters, compile_cfg,
                                             counting.graphs, hooks)
            t0 = time.time()
            try:
                runner.train()
            except Exception as err:    # reported in the JSON and the doc
                failure = _failure(err, counting, len(compiled.losses) + 1)
                print(f'compiled run stopped: {failure}')
            else:
                failure = None
            wall = time.time() - t0
        finally:
            recompiles.removeHandler(handler)
            torch._logging.set_logs()
    counters = torch._dynamo.utils.counters
    ref = eager.losses[0]
    first = compiled.losses[0] if compiled.losses else None
    return dict(
        config=CONFIG, form=form, backend=backend, iters=iters,
        mkldnn=mkldnn, torch=torch.__version__,
        input_shapes=compiled.shapes,
        losses=compiled.losses,
        eager_first_losses=ref,
        first_loss_max_relative_difference=None if first is None else max(
            abs(first[k] - ref[k]) / max(abs(ref[k]), 1e-12) for k in ref),
        failure=failure,
        graphs=len(counting.graphs),
        backbone_graphs=sum(g['backbone'] for g in counting.graphs),
        graph_modules=[g['modules'] for g in counting.graphs],
        abandoned_graph_modules=[g['modules'] for g in counting.abandoned],
        graphs_after_each_iteration=compiled.graphs,
        graph_breaks=sum(counters['graph_break'].values()),
        recompiles_by_function=_recompiles_by_function(lines),
        compiled_run_seconds=round(wall, 1),
        total_seconds=round(time.time() - start, 1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--form', choices=('true', 'dict', 'backbone'),
                        default='true')
    parser.add_argument('--backend', default='inductor')
    parser.add_argument('--iters', type=int, default=8)
    parser.add_argument('--without-mkldnn', action='store_true',
                        help='disable torch.backends.mkldnn in both runs: '
                        'inductor then chooses layouts as on a CUDA device')
    parser.add_argument('--json', default=None)
    args = parser.parse_args(argv)
    if not osp.isdir('data/demo_coco'):
        parser.error('data/demo_coco is missing: run python '
                     'tools/make_demo_data.py first')
    result = run(args.form, args.backend, args.iters,
                 mkldnn=not args.without_mkldnn)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, 'w') as f:
            f.write(text + '\n')


if __name__ == '__main__':
    main()
