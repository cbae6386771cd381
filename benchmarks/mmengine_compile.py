"""mmengine's ``compile`` on the demo RetinaNet, as a config asks for it.

    python -m benchmarks.mmengine_compile [--form true|dict|backbone]
        [--backend inductor] [--iters 8] [--without-mkldnn] [--json PATH]
    python -m benchmarks.mmengine_compile --update-doc docs/training.md \
        --from-json A.json [B.json ...]

Trains the demo detector (configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py
on data/demo_coco, from ``python tools/make_demo_data.py``) for a few
iterations of two images at seven input scales, with the runner's
``compile`` set: ``--form true`` is torch.compile's defaults (what
``compile=True`` gives: ``dynamic=None``), ``--form dict`` is
``compile=dict(backend=..., dynamic=True)``. mmengine compiles the whole
``train_step``: data preprocessor, backbone, neck, head, losses and the
optimizer step. ``--form backbone`` sets no ``compile`` and names
``CompileBackboneHook(backend=..., dynamic=True)`` in ``custom_hooks``:
the backbone alone is compiled, the rest runs eagerly.

It reports each graph dynamo compiled, and whether it holds backbone
operations; the number of graph breaks and recompilations, by function;
the losses of every iteration; and the first iteration's losses against an
eager run of the same config and seed (same weights, same batch).

``--without-mkldnn`` runs both with ``torch.backends.mkldnn`` disabled. On
a CPU with mkldnn, inductor lays out every graph that has a convolution
for channels-last (``GraphLowering.decide_layout_opt``), and the restrided
tensors of the neck's convolutions put a guard on the input size in the
backward; on a CUDA device, a convolution with dynamic sizes turns that
layout optimization off (pytorch issue 102670). Without mkldnn a CPU takes
the CUDA branch, so the run shows which recompilations are the CPU's.
"""
from __future__ import annotations

import argparse
import collections
import json
import os.path as osp
import tempfile
import time
import traceback

import torch

from .measure import log

CONFIG = 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py'
PAD = 32  # the demo config's data_preprocessor.pad_size_divisor
# (w, h), keep-ratio: every batch pads to a different multiple of 32
SCALES = [(256, 192), (288, 224), (320, 240), (224, 160), (352, 256),
          (240, 208), (272, 176)]


class CountingBackend:
    """A torch.compile backend that notes each graph dynamo hands it
    (whether it holds backbone operations) and compiles it with
    ``backend``.

    Dynamo may trace a frame again after handing a graph over: under
    ``dynamic=True`` a module's float attributes (a norm's ``eps``) become
    symbols, and torch restarts the analysis to specialize them
    (``fx/passes/_tensorify_python_scalars.py``). The later attempt's graph
    replaces the abandoned one, which never runs; ``abandoned`` keeps
    those."""

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
    """What stopped a compiled run: the error, the graph dynamo last handed
    the backend, and, where inductor was lowering one, the node it was at
    and the source line that made it."""
    message = str(err).strip().splitlines()
    found, seen, cause = {}, set(), err
    while cause is not None and id(cause) not in seen:   # chained causes
        seen.add(id(cause))
        for frame, _ in traceback.walk_tb(cause.__traceback__):
            node = frame.f_locals.get('n')
            if frame.f_code.co_name == 'run_node' and \
                    isinstance(node, torch.fx.Node):
                trace = (node.meta.get('stack_trace') or '').strip()
                found = dict(node=node.format_node()[:300],
                             source=trace.splitlines()[-2:])
        cause = cause.__cause__ or cause.__context__
    last = counting.graphs[-1] if counting.graphs else {}
    return dict(iteration=iteration, error=type(err).__name__,
                message=message[-1][:400] if message else '', **found,
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
        log(f'eager: 1 iteration of {CONFIG}')
        runner, eager = _build_runner(osp.join(tmp, 'eager'), 1, None)
        runner.train()
        log(f'compiled ({form}, {backend}): {iters} iterations')
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
                log(f'compiled run stopped: {failure}')
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


def _where(function: str) -> str:
    """'fn in /.../site-packages/mmdet/models/x.py:12' -> 'mmdet/models/x.py'"""
    path = function.split(' in ', 1)[-1].rsplit(':', 1)[0]
    return path.split('site-packages/', 1)[-1]


def _stopped(form: str, failure: dict) -> str:
    """A line on a run that stopped: where and why."""
    where = ''
    if failure.get('node'):
        source = ' '.join(line.strip() for line in failure.get('source', []))
        where = (f" Inductor was lowering `{failure['node']}`"
                 + (f", from `{source}`" if source else '') + '.')
    modules = ', '.join(failure.get('graph_modules') or []) or 'none'
    return (f"- {form} stopped in iteration {failure['iteration']}: "
            f"`{failure['error']}: {failure['message']}`.{where} The last "
            f"graph dynamo handed over (frame {failure['graph_frame']}) "
            f"holds modules: {modules}.\n\n")


def render(results) -> str:
    """The doc section: one row per run, then a line on each run that
    stopped."""
    stops = []
    rows = ['| `compile` | iterations (padded sizes) | graphs (graph breaks) '
            '| graphs holding the backbone: iteration 1, later | '
            'traces abandoned by a restart (holding the backbone) | '
            'recompilations, by file | first iteration\'s losses against '
            'eager\'s | compiled run |',
            '|---|---|---|---|---|---|---|---|']
    for r in results:
        if r['form'] == 'dict':
            form = f"`dict(backend='{r['backend']}', dynamic=True)`"
        elif r['form'] == 'backbone':
            form = (f"none; `CompileBackboneHook(backend='{r['backend']}', "
                    "dynamic=True)`")
        elif r['backend'] == 'inductor':
            form = '`True`'
        else:  # True's defaults but the backend
            form = f"`dict(backend='{r['backend']}')`"
        if not r.get('mkldnn', True):
            form += ', mkldnn off'
        # the batch as the backbone sees it: the data preprocessor pads
        # to the largest image, then to a multiple of PAD
        sizes = {tuple(-(-max(s[i] for s in batch) // PAD) * PAD
                       for i in (0, 1)) for batch in r['input_shapes']}
        after = r['graphs_after_each_iteration']
        modules = r['graph_modules']
        first = sum('backbone' in m for m in modules[:after[0]])
        later = sum('backbone' in m for m in modules[after[0]:])
        files = collections.Counter()
        for function, n in r['recompiles_by_function'].items():
            files[_where(function)] += n
        recompiles = ', '.join(f'{f} {n}' for f, n in files.most_common())
        abandoned = r.get('abandoned_graph_modules')
        abandoned = '-' if abandoned is None else (
            f"{len(abandoned)} ({sum('backbone' in m for m in abandoned)})")
        difference = r['first_loss_max_relative_difference']
        failure = r.get('failure')
        ran = f"{len(r['losses'])} of {r['iters']}" if failure else \
            str(r['iters'])
        rows.append(
            f"| {form} | {ran} ({len(sizes)} sizes) | {r['graphs']} "
            f"({r['graph_breaks']}) | {first}, {later} | {abandoned} | "
            f"{recompiles or '-'} | "
            f"{'-' if difference is None else f'{difference:.1e}'} | "
            f"{r['compiled_run_seconds']:.0f} s"
            f"{', stopped' if failure else ''} |")
        if failure:
            stops.append(_stopped(form, failure))
    r = results[0]
    return ('\n'.join(rows) + '\n\n' + ''.join(stops) +
            f"torch {r['torch']}, {r['config']}, two images per iteration. "
            'A graph holds the backbone where one of its nodes comes from a '
            'module under `backbone`. A trace abandoned by a restart is a '
            'graph dynamo handed to the backend and then traced again (under '
            '`dynamic=True`, for one, to specialize float attributes such as '
            'a norm\'s `eps`); it never runs, and the graph that replaced it '
            'is counted.\n')


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
    parser.add_argument('--update-doc', default=None, metavar='PAGE',
                        help='write the section "mmengine-compile" of PAGE '
                        'from the --from-json files; runs nothing')
    parser.add_argument('--from-json', nargs='+', default=())
    args = parser.parse_args(argv)
    if args.update_doc:
        from .doc_sections import update_file
        if not args.from_json:
            parser.error('--update-doc needs --from-json')
        results = []
        for path in args.from_json:
            with open(path) as f:
                results.append(json.load(f))
        update_file(args.update_doc, {'mmengine-compile': render(results)},
                    ' and '.join(args.from_json),
                    tool='python -m benchmarks.mmengine_compile')
        return
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
