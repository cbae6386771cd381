#!/usr/bin/env python
"""Speed, memory and cost of PosMLP backbones against Swin and ResNet-50,
in inference and in training.

All models of a part run in one process, on the same inputs, and their
timed runs are interleaved round by round, so that a machine whose speed
drifts (other jobs, clock changes) affects every model alike.

Inference part, for every (input size, batch, mode):

* median (and fastest) latency of a backbone forward (``fwd``: eval mode,
  no autograd) or training step (``fwdbwd``: see below), images per second;
* peak memory of the call (see ``benchmarks.measure.PeakMemory``);
* parameters, and multiply-adds counted by ``torch.utils.flop_counter``
  (MACs = counted FLOPs / 2; it counts mm, addmm, bmm, baddbmm and
  convolutions, and einsum / matmul / ``@`` run as those, so the token
  mixing and Swin's attention matmuls are included);
* achieved GFLOP/s, also as a fraction of a large fp32 matmul timed in the
  same run (the calibration).

Scaling part: how forward latency grows with the input size (square inputs,
batch 1), fitted as latency ~ pixels ** exponent.

Training part (``benchmarks.training``): backbone training steps
(train mode, fp32: forward, the sum of half the output channels, backward) and
whole RetinaNet training iterations, each with and without gradient
checkpointing (``with_cp``): step time, peak memory growth (on a CPU in a
fresh process per row) and the activation bytes autograd saves per image.

GPU-proxy part (``benchmarks.gpu_proxy``; ``--gpu-proxy``, or
``--gpu-proxy-only`` for it alone): device-independent figures of one
step per model, counted on this machine: the operations that launch work
(on a GPU in eager mode, each at least one kernel launch), the bytes they
write, the host syncs and the FLOPs, and the time they imply on an NVIDIA
H200 SXM, in fp32 and under bfloat16 autocast; with issue 30's targets
against Swin-T.

``--update-doc docs/performance.md`` rewrites that page's generated
sections from the run's JSON: "cpu-vs-swin" (``benchmarks.like_for_like``)
from a run that times PosMLP-T and Swin-T, "gpu-proxy" and "compile"
from those parts.

Models: ``posmlp_t``/``posmlp_s`` (this package), ``swin_t``/``swin_s`` and
``resnet50`` (built from mmdet's registry), and ``published_port``: the
PosMLP-T weights run the way the published code runs them (see
``benchmarks.published_port``), the baseline the mixing is
compared with.

Writes ``benchmark.json`` (every raw number and the environment),
``benchmark.png`` (chart) and ``benchmark.md`` (tables for the README).

Examples::

    python tools/benchmark.py                 # the full default run
    python tools/benchmark.py --quick         # a few minutes
    python tools/benchmark.py --sizes 800x1333 --batches 1 --modes fwd \\
        --models posmlp_t,swin_t,published_port --repeats 5 --no-training
    python tools/benchmark.py --training-only --train-shapes 2x512x512
    python tools/benchmark.py --training-only --keep-freed-memory
    python tools/benchmark.py --gpu-proxy-only \
        --out docs/performance/gpu_proxy.json --update-doc docs/performance.md

The benchmark changes no process-wide numeric setting (no flushing of
subnormal floats, no TF32 switches, torch's default thread count). Only
``--keep-freed-memory`` changes the process it measures in: it runs the
command again in a child whose glibc malloc keeps freed memory, and the
report records that.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from typing import List, Optional, Tuple

import torch

from benchmarks.cli_sizes import parse_dims
from benchmarks.compiled import run_compiled
from benchmarks.doc_sections import update_file, update_sections
from benchmarks.gpu_proxy import MODELS as PROXY_MODELS
from benchmarks.gpu_proxy import PATHS as PROXY_PATHS
from benchmarks.gpu_proxy import STEP_MODES, STEPS, run_gpu_proxy
from benchmarks.inductor_counts import (inductor_counts_markdown,
                                       run_inductor_counts)
from benchmarks.inference import MacCounter, run_scaling, run_settings
from benchmarks.like_for_like import like_for_like_markdown
from benchmarks.measure import (
    MEMORY_METHODS, MODES, SOURCE_ROOT, PeakMemory, environment,
    environment_keeping_freed_memory, fit_exponent, keeps_freed_memory, log,
    make_input, matmul_calibration, size_name)
from benchmarks.models import ALL_MODELS, build_models, count_params
from benchmarks.published_port import port_check
from benchmarks.report import (chart, compiled_markdown, gpu_proxy_markdown,
                               markdown, target_lines)
from benchmarks.training import (
    DETECTOR_BACKBONES, MEMORY_MODES, TrainingCase, run_training)
from posmlp_dense.known_warnings import hide_known_third_party_warnings

# Backbones the training part can build (the published port shares
# PosMLP-T's weights and has no checkpointing).
TRAIN_MODELS = tuple(n for n in ALL_MODELS if n != 'published_port')

# Defaults: the inference and scaling parts took about 11 minutes on an
# idle 2-core CPU with fwdbwd included (two to five times as long while
# other jobs run); the training part adds roughly 15-20 minutes there (see
# the README). --quick is a subset of a few minutes. fwdbwd stops at
# 512x512 (--fwdbwd-max-pixels 0 runs it anyway): the training part
# measures training steps at 800x1333, with an honest memory figure.
DEFAULTS = dict(
    models=','.join(ALL_MODELS), sizes='224,512,800x1333', batches='1,2',
    modes='fwd', fwdbwd_models='posmlp_t,posmlp_s,swin_t,swin_s,resnet50',
    fwdbwd_max_pixels=512 * 512, repeats=5, warmup=1,
    scaling_sizes='512,800,1024,1333,1600', scaling_models='posmlp_t,swin_t',
    scaling_repeats=3, train_models='posmlp_t,swin_t,resnet50',
    train_shapes='2x512x512,1x800x1333', train_cp='off,on',
    detectors='posmlp_t,swin_t', detector_shape='1x800x1333',
    train_repeats=3, train_warmup=1)
QUICK = dict(
    models='posmlp_t,swin_t,resnet50,published_port', sizes='224,800x1333',
    batches='1', modes='fwd', fwdbwd_models='posmlp_t,swin_t',
    fwdbwd_max_pixels=224 * 224, repeats=2, warmup=1, scaling_sizes='512,1024',
    scaling_models='posmlp_t,swin_t', scaling_repeats=2,
    train_models='posmlp_t,swin_t', train_shapes='1x512x512', train_cp='off',
    detectors='none', detector_shape='1x800x1333', train_repeats=3,
    train_warmup=1)


def parse_list(text: Optional[str]) -> List[str]:
    if text is None or text.strip().lower() in ('', 'none'):
        return []
    return [t.strip() for t in text.split(',') if t.strip()]


def parse_size_arg(text: str, layout: str, what: str) -> Tuple[int, ...]:
    """One size written as ``layout`` (see cli_sizes; 'HxW' also takes 'S',
    square); a bad one exits."""
    try:
        return parse_dims(text, layout, square=True)
    except argparse.ArgumentTypeError as err:
        raise SystemExit(f'bad {what} {err}') from None


def parse_sizes(text: Optional[str], layout: str, what: str
                ) -> List[Tuple[int, ...]]:
    return [parse_size_arg(s, layout, what) for s in parse_list(text)]


def parse_compile_cases(text: str) -> List[Tuple[int, Optional[bool]]]:
    """'BATCH:DYNAMIC,...' -> [(batch, True or None)]; a bad entry exits
    naming it."""
    cases = []
    for item in parse_list(text):
        batch, _, dynamic = item.partition(':')
        if not batch.isdigit() or int(batch) < 1 or \
                dynamic.lower() not in ('true', 'none'):
            raise SystemExit(f"bad --compile-cases entry {item!r}: write "
                             f"BATCH:true or BATCH:none, as in 2:none")
        cases.append((int(batch), True if dynamic.lower() == 'true'
                      else None))
    return cases


def parse_proxy_steps(text: str, option: str = '--gpu-proxy-steps'
                      ) -> List[Tuple[str, Tuple[int, ...]]]:
    """'MODE:BxHxW,...' -> [(mode, (batch, height, width))]; a bad entry
    exits naming it and ``option``."""
    steps = []
    for item in parse_list(text):
        mode, _, shape = item.partition(':')
        if mode not in STEP_MODES or not shape:
            raise SystemExit(f'bad {option} entry {item!r}: expected '
                             f'MODE:BxHxW with MODE one of '
                             f'{", ".join(STEP_MODES)}')
        steps.append((mode, parse_size_arg(shape, 'BxHxW',
                                           f'{option} shape')))
    return steps


# The generated sections of --update-doc's page that this benchmark writes,
# and what writes each from a report.
DOC_SECTIONS = {'cpu-vs-swin': like_for_like_markdown,
                'gpu-proxy': gpu_proxy_markdown, 'compile': compiled_markdown,
                'inductor-counts': inductor_counts_markdown}


def parse_cp(text: str) -> List[bool]:
    values = {'off': False, 'on': True}
    out = []
    for t in parse_list(text):
        if t not in values:
            raise SystemExit(f'bad --train-cp value {t!r}: use off and/or on')
        out.append(values[t])
    return out


def checked(names: List[str], allowed, what: str) -> List[str]:
    for n in names:
        if n not in allowed:
            raise SystemExit(f'unknown {what} {n!r}; choose from '
                             f'{", ".join(allowed)}')
    return names


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true',
                   help='a subset of a few minutes (explicit flags still '
                        'override it)')
    g = p.add_argument_group('inference and scaling parts')
    g.add_argument('--models', help=f'comma list from {",".join(ALL_MODELS)} '
                   f'(default: all; the fwdbwd and scaling runs take theirs '
                   f'from --fwdbwd-models and --scaling-models)')
    g.add_argument('--sizes', help='input sizes HxW or S (square), comma '
                   f'list (default {DEFAULTS["sizes"]})')
    g.add_argument('--batches', help=f'default {DEFAULTS["batches"]}')
    g.add_argument('--modes', help=f'fwd and/or fwdbwd (default '
                   f'{DEFAULTS["modes"]}; the training part has the '
                   f'training steps)')
    g.add_argument('--fwdbwd-models', help='models that also run fwdbwd '
                   f'(default {DEFAULTS["fwdbwd_models"]}; "all" for all)')
    g.add_argument('--fwdbwd-max-pixels', type=int, help='fwdbwd runs only '
                   'at the --sizes with at most this many pixels (default '
                   f'{DEFAULTS["fwdbwd_max_pixels"]}; 0: all sizes)')
    g.add_argument('--repeats', type=int, help='timed runs per model and '
                   f'setting (default {DEFAULTS["repeats"]})')
    g.add_argument('--warmup', type=int, help='untimed runs of every model '
                   'before the first batch of each size and mode (default '
                   f'{DEFAULTS["warmup"]})')
    g.add_argument('--warmup-each', action='store_true',
                   help='warm up before every batch, not only the first')
    g.add_argument('--scaling-sizes', help='square sizes of the scaling fit '
                   f'(default {DEFAULTS["scaling_sizes"]}; "none" to skip)')
    g.add_argument('--scaling-models', help='default '
                   f'{DEFAULTS["scaling_models"]}')
    g.add_argument('--scaling-repeats', type=int)
    g.add_argument('--check-size', default='224', help='size at which the '
                   'published port is checked against PosMLP-T ("none" to '
                   'skip); windows must tile every level')
    g.add_argument('--no-count', action='store_true',
                   help='skip the MAC counting (inference) and the FLOP '
                        'counting (training)')
    g.add_argument('--real-count', action='store_true',
                   help='count MACs and FLOPs on real tensors (default: '
                        'fake tensors, same counts without the arithmetic)')
    t = p.add_argument_group('training part')
    t.add_argument('--training-only', action='store_true',
                   help='run only the training part')
    t.add_argument('--no-training', action='store_true',
                   help='skip the training part')
    t.add_argument('--train-models', help='backbones whose training step is '
                   f'timed, from {",".join(TRAIN_MODELS)} (default '
                   f'{DEFAULTS["train_models"]}; "none" to skip)')
    t.add_argument('--train-shapes', help='BxHxW of the backbone steps, '
                   f'comma list (default {DEFAULTS["train_shapes"]})')
    t.add_argument('--train-cp', help='gradient checkpointing: off, on or '
                   f'off,on (default {DEFAULTS["train_cp"]}); applies to the '
                   f'detectors too')
    t.add_argument('--detectors', help='RetinaNet backbones, from '
                   f'{",".join(DETECTOR_BACKBONES)} (default '
                   f'{DEFAULTS["detectors"]}; "none" to skip)')
    t.add_argument('--detector-shape', help='BxHxW of the detector '
                   f'iteration (default {DEFAULTS["detector_shape"]})')
    t.add_argument('--train-repeats', type=int, help='timed steps per row '
                   f'(default {DEFAULTS["train_repeats"]})')
    t.add_argument('--train-warmup', type=int, help='untimed steps per row '
                   f'first (default {DEFAULTS["train_warmup"]})')
    t.add_argument('--train-memory', default='auto',
                   choices=('auto',) + MEMORY_MODES,
                   help='peak memory of the training rows: in a fresh '
                        'process per row, in the timing process, or not at '
                        'all (auto: fresh on CPU, inprocess on CUDA)')
    gp = p.add_argument_group('GPU-proxy part')
    gp.add_argument('--gpu-proxy', action='store_true',
                    help='also count operations, bytes written, host syncs '
                         'and FLOPs per step, and estimate the time on an '
                         'NVIDIA H200 (benchmarks.gpu_proxy)')
    gp.add_argument('--gpu-proxy-only', action='store_true',
                    help='run only the GPU-proxy part (minutes)')
    gp.add_argument('--gpu-proxy-fp32-only', action='store_true',
                    help='count the steps in fp32 only, not also under '
                         'bfloat16 autocast (half the time)')
    gp.add_argument('--gpu-proxy-models', default=','.join(PROXY_MODELS),
                    help='comma list from ' + ','.join(ALL_MODELS) +
                         ' (default %(default)s)')
    gp.add_argument('--gpu-proxy-steps', default=','.join(
        f"{mode}:{'x'.join(map(str, shape))}" for mode, shape in STEPS),
        help='MODE:BxHxW comma list, MODE inference (eval, no autograd) or '
             'train (forward and backward) (default %(default)s)')
    gp.add_argument('--gpu-proxy-path', choices=PROXY_PATHS,
                    default='cuda',
                    help="which code path of the models to count: cuda "
                         "(default; on a machine without a GPU, inference "
                         "on fake CUDA tensors and training on the CPU, see "
                         "benchmarks.gpu_proxy.counting_place) or cpu (real "
                         "CPU tensors throughout)")
    gp.add_argument('--update-doc', metavar='PAGE',
                    help='after the run (or with --from-json), rewrite the '
                         'generated sections of this Markdown page (between '
                         'their marker lines) from the JSON: "cpu-vs-swin" '
                         'with the inference or training part, "gpu-proxy" '
                         'with --gpu-proxy(-only), "compile" with '
                         '--compile(-only)')
    cp = p.add_argument_group('torch.compile part')
    cp.add_argument('--compile', action='store_true',
                    help="also compile PosMLP-T's training step "
                         '(torch.compile) for each of --compile-cases and '
                         'report the first-call time, the compiled step '
                         'against eager, and the graphs taken by further '
                         'sizes (benchmarks.compiled)')
    cp.add_argument('--compile-only', action='store_true',
                    help='run only the torch.compile part')
    cp.add_argument('--compile-shape', default='512x512',
                    help='HxW of the timed step (default %(default)s)')
    cp.add_argument('--compile-cases', default='1:true,2:true,1:none,2:none',
                    help="BATCH:DYNAMIC comma list, DYNAMIC torch.compile's "
                         "argument: 'true' or 'none' (its default, automatic "
                         'dynamic shapes); each case compiles afresh '
                         '(default %(default)s)')
    cp.add_argument('--compile-sizes',
                    default='480x544,544x480,448x608,576x416,512x640,'
                            '608x512',
                    help='HxW comma list run after the timed step, each of '
                         'which must reuse its graph (default %(default)s)')
    cp.add_argument('--compile-backend', default='inductor',
                    help='torch.compile backend (default %(default)s)')
    cp.add_argument('--compile-repeats', type=int, default=3,
                    help='timed eager and compiled steps, interleaved '
                         '(default %(default)s, after one warm-up each)')
    cp.add_argument('--inductor-counts', action='store_true',
                    help='also compile steps with inductor (static shapes) '
                         'and report the kernels it makes and the bytes '
                         'they read and write, beside the eager step\'s '
                         'operations and bytes (benchmarks.inductor_counts)')
    cp.add_argument('--inductor-counts-only', action='store_true',
                    help='run only the inductor counts')
    cp.add_argument('--inductor-counts-steps',
                    default='inference:1x800x1333,train:2x512x512',
                    help='MODE:BxHxW comma list, MODE inference or train '
                         '(default %(default)s)')
    cp.add_argument('--inductor-counts-models', default='posmlp_t,swin_t',
                    help='models of the inductor counts (default '
                         '%(default)s)')
    p.add_argument('--keep-freed-memory', action='store_true',
                   help='run in a child process whose malloc keeps freed '
                        'memory (glibc tunables, Linux): no step pays page '
                        'faults for fresh memory, as on a GPU with its '
                        'caching allocator, and the times are steadier. '
                        'Memory figures then show only what a process had '
                        'to add (--train-memory defaults to none): take '
                        'them from a run without this flag')
    p.add_argument('--posmlp-arch', help='JSON dict: custom arch for posmlp_t '
                   'and the published port (for tests)')
    p.add_argument('--device', default='auto', choices=('auto', 'cpu',
                                                        'cuda'))
    p.add_argument('--calib-size', type=int, help='matmul calibration size '
                   '(default 2048 on CPU, 8192 on CUDA)')
    p.add_argument('--mem-interval-ms', type=float, default=1.0,
                   help='RSS sampling interval on CPU')
    p.add_argument('--no-chart', action='store_true')
    p.add_argument('--from-json', metavar='JSON',
                   help='run nothing: rewrite the Markdown and the chart of '
                        'an earlier run next to its JSON')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=os.path.join('work_dirs', 'benchmark',
                                                 'benchmark.json'),
                   help='the JSON file (the Markdown and the chart go next '
                        'to it); a directory gets benchmark.json inside')
    args = p.parse_args(argv)
    if args.training_only and args.no_training:
        p.error('--training-only and --no-training exclude each other')
    if args.gpu_proxy_only and args.training_only:
        p.error('--gpu-proxy-only and --training-only exclude each other')
    if args.compile_only and (args.gpu_proxy_only or args.training_only):
        p.error('--compile-only excludes --gpu-proxy-only and '
                '--training-only')
    if args.inductor_counts_only and (args.gpu_proxy_only or
                                      args.training_only or args.compile_only):
        p.error('--inductor-counts-only excludes the other --*-only options')
    if args.update_doc:
        sections = doc_sections(args)
        check_doc(args.update_doc, sections, p.error)
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.train_repeats < 1:
        p.error('--train-repeats must be at least 1')
    if not args.from_json:
        args.out = output_path(args.out, p.error)
    return args


def doc_sections(args) -> List[str]:
    """The generated sections this run writes."""
    if args.from_json:
        return []  # those the JSON has figures for (update_doc)
    timed = not (args.gpu_proxy_only or args.compile_only or
                 args.inductor_counts_only)
    return ([name for name, wanted in (
        ('cpu-vs-swin', timed),
        ('gpu-proxy', args.gpu_proxy or args.gpu_proxy_only),
        ('compile', args.compile or args.compile_only),
        ('inductor-counts', args.inductor_counts or
         args.inductor_counts_only)) if wanted])


def check_doc(path: str, sections: List[str], error):
    """Before anything runs: the page --update-doc names exists and has
    the markers of the sections this run writes."""
    try:
        with open(path, encoding='utf-8') as f:
            update_sections(f.read(), {name: '' for name in sections}, path)
    except (OSError, ValueError) as err:
        error(f'--update-doc {path}: {err}')


def update_doc(report: dict, json_path: str, page: str):
    """Rewrite ``page``'s generated sections that ``report`` has figures
    for."""
    sections = {}
    for name, write in DOC_SECTIONS.items():
        lines = write(report, heading='##')
        if lines:
            sections[name] = '\n'.join(lines)
    if not sections:
        raise SystemExit(f'--update-doc: {json_path} has no figures of '
                         f'the sections {", ".join(DOC_SECTIONS)} (PosMLP-T '
                         f'and Swin-T timed, GPU-proxy rows, compile '
                         f'figures)')
    try:
        update_file(page, sections, os.path.relpath(json_path))
    except ValueError as err:
        raise SystemExit(f'--update-doc {page}: {err}') from None
    log(f'rewrote the sections {", ".join(map(repr, sections))} of {page}')


def run_keeping_freed_memory(argv, out: str) -> dict:
    """This command again, in a child process started with malloc
    settings that keep freed memory (they take effect at a process's
    start only); returns the child's report."""
    try:
        env = environment_keeping_freed_memory()
    except RuntimeError as e:
        raise SystemExit(f'--keep-freed-memory: {e}') from None
    # the child imports the benchmarks (and posmlp_dense) of the checkout
    # this process runs, not whichever copy the environment has installed
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (SOURCE_ROOT, env.get('PYTHONPATH')) if p)
    argv = sys.argv[1:] if argv is None else list(argv)
    log(f'running again with GLIBC_TUNABLES={env["GLIBC_TUNABLES"]}')
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                          env=env)
    if done.returncode:
        raise SystemExit(f'the run with --keep-freed-memory failed (exit '
                         f'status {done.returncode})')
    with open(out) as f:
        return json.load(f)


def output_path(out: str, error) -> str:
    """Where the JSON goes, decided and checked before anything runs (a
    run takes many minutes; its results must not be lost at the end): a
    directory, existing or written with a trailing separator, gets
    benchmark.json inside it."""
    if os.path.isdir(out) or out.endswith(('/', os.sep)):
        out = os.path.join(out, 'benchmark.json')
    folder = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        error(f'--out {out}: cannot create its folder ({err})')
    if os.path.isdir(out) or not os.access(folder, os.W_OK):
        error(f'--out {out}: not a writable file path')
    return out


def write_outputs(report: dict, out: str, with_chart: bool = True) -> str:
    """benchmark.md (and benchmark.png, when there is something to draw)
    next to ``out``; returns the Markdown."""
    stem = os.path.splitext(out)[0]
    md = markdown(report)
    with open(stem + '.md', 'w') as f:
        f.write(md)
    report['files'] = dict(json=out, markdown=stem + '.md')
    if with_chart and chart(report, stem + '.png'):
        report['files']['chart'] = stem + '.png'
    return md


def rewrite_from_json(path: str, with_chart: bool) -> dict:
    with open(path) as f:
        report = json.load(f)
    for fit in report.get('scaling', {}).values():
        if 'exponent_min' not in fit and 'times' in fit:  # older runs
            fit['min_s'] = [min(t) for t in fit['times']]
            fast = fit_exponent(fit['pixels'], fit['min_s'])
            fit['exponent_min'], fit['r2_min'] = fast['exponent'], fast['r2']
    report['targets'] = target_lines(report)
    print(write_outputs(report, path, with_chart))
    return report


def rewrite_and_update(args) -> dict:
    report = rewrite_from_json(args.from_json, not args.no_chart)
    if args.update_doc:
        update_doc(report, args.from_json, args.update_doc)
    return report


def choose_device(name: str) -> torch.device:
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if name == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: torch sees no CUDA device '
                         f'(torch {torch.__version__}, built for CUDA '
                         f'{torch.version.cuda})')
    return torch.device(name)


def training_cases(args) -> List[TrainingCase]:
    if args.no_training:
        return []
    cps = parse_cp(args.train_cp)
    cases = [TrainingCase('backbone', n, cp, shape)
             for shape in parse_sizes(args.train_shapes, 'BxHxW',
                                      'training shape')
             for n in checked(parse_list(args.train_models), TRAIN_MODELS,
                              'training model')
             for cp in cps]
    detector_shape = parse_size_arg(args.detector_shape, 'BxHxW',
                                    'detector shape')
    cases += [TrainingCase('detector', n, cp, detector_shape)
              for n in checked(parse_list(args.detectors),
                               DETECTOR_BACKBONES, 'detector backbone')
              for cp in cps]
    return cases


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        return rewrite_and_update(args)
    if args.keep_freed_memory and not keeps_freed_memory():
        return run_keeping_freed_memory(argv, args.out)
    start = time.perf_counter()
    device = choose_device(args.device)
    inference = not (args.training_only or args.gpu_proxy_only
                     or args.compile_only or args.inductor_counts_only)
    names = checked(parse_list(args.models), ALL_MODELS, 'model') \
        if inference else []
    fb = parse_list(args.fwdbwd_models)
    fwdbwd_names = [n for n in names if 'all' in fb or n in fb]
    sizes = parse_sizes(args.sizes, 'HxW', 'input size')
    fwdbwd_sizes = [s for s in sizes if args.fwdbwd_max_pixels <= 0
                    or s[0] * s[1] <= args.fwdbwd_max_pixels]
    batches = [int(b) for b in parse_list(args.batches)]
    modes = checked(parse_list(args.modes), MODES, 'mode')
    scaling_sizes = parse_sizes(args.scaling_sizes, 'HxW', 'scaling size') \
        if inference else []
    scaling_names = checked(parse_list(args.scaling_models), ALL_MODELS,
                            'model') if scaling_sizes else []
    cases = [] if (args.gpu_proxy_only or args.compile_only or
                   args.inductor_counts_only) else \
        training_cases(args)
    compile_shape = parse_size_arg(args.compile_shape, 'HxW',
                                   'compile shape') \
        if args.compile or args.compile_only else None
    compile_sizes = parse_sizes(args.compile_sizes, 'HxW', 'compile size') \
        if compile_shape else []
    compile_cases = parse_compile_cases(args.compile_cases) \
        if compile_shape else []
    proxy_steps = parse_proxy_steps(args.gpu_proxy_steps) \
        if args.gpu_proxy or args.gpu_proxy_only else []
    proxy_names = checked(parse_list(args.gpu_proxy_models), ALL_MODELS,
                          'GPU-proxy model') if proxy_steps else []
    counted_steps = parse_proxy_steps(args.inductor_counts_steps,
                                      '--inductor-counts-steps') \
        if args.inductor_counts or args.inductor_counts_only else []
    counted_names = checked(parse_list(args.inductor_counts_models),
                            ALL_MODELS, 'inductor-counts model') \
        if counted_steps else []
    train_memory = args.train_memory if args.train_memory != 'auto' else (
        'none' if args.keep_freed_memory else
        'inprocess' if device.type == 'cuda' else 'fresh')
    posmlp_arch = json.loads(args.posmlp_arch) if args.posmlp_arch else None
    mem_interval = args.mem_interval_ms / 1e3
    calib_n = args.calib_size or (8192 if device.type == 'cuda' else 2048)
    needed = list(dict.fromkeys(names + scaling_names))

    env = environment(device)
    log(f'torch {env["torch"]}, {env["threads"]} threads (torch default), '
        f'device {device}'
        + (f' ({env["cuda_device"]})' if device.type == 'cuda' else '')
        + f', CPU {env.get("cpu_model", "?")}')
    if names:
        log(f'inference: models {", ".join(needed)}; sizes '
            f'{", ".join(size_name(s) for s in sizes)}; batches {batches}; '
            f'modes {modes}; {args.repeats} repeats after {args.warmup} '
            f'warm-up', start)
    if proxy_steps:
        log(f'GPU proxy: models {", ".join(proxy_names)}; steps '
            f'{args.gpu_proxy_steps}; the {args.gpu_proxy_path} path', start)
    if cases:
        log(f'training: {len(cases)} rows; {args.train_repeats} timed steps '
            f'after {args.train_warmup} warm-up; peak memory: {train_memory}',
            start)
    with PeakMemory(device, mem_interval) as probe:
        pass
    mem_method = probe.method
    calibs = [matmul_calibration(device, calib_n)]
    log(f'peak memory method: {mem_method}', start)
    log(f'matmul calibration: {calibs[0]["gflops"]:.1f} GFLOP/s', start)

    report = dict(
        config=dict(vars(args), models=names, sizes=[list(s) for s in sizes],
                    batches=batches, modes=modes, fwdbwd_models=fwdbwd_names,
                    fwdbwd_sizes=[list(s) for s in fwdbwd_sizes],
                    scaling_sizes=[list(s) for s in scaling_sizes],
                    scaling_models=scaling_names,
                    training_cases=[c.as_dict() for c in cases],
                    gpu_proxy_models=proxy_names,
                    gpu_proxy_steps=[[m, list(sh)] for m, sh in proxy_steps],
                    train_memory=train_memory),
        environment=env, params={},
        memory_method_key=mem_method,
        memory_method=MEMORY_METHODS[mem_method].format(
            interval=f'{args.mem_interval_ms:g}')
        + '; max over the timed runs',
        results=[], scaling={}, macs={}, training=[])

    if needed:
        models = build_models(needed, posmlp_arch, args.seed)
        for m in models.values():
            m.to(device)
        report['params'] = {n: count_params(m) for n, m in models.items()}
        if ('posmlp_t' in models and 'published_port' in models
                and args.check_size.lower() != 'none'):
            c = report['port_check'] = port_check(
                models['posmlp_t'], models['published_port'],
                make_input(parse_size_arg(args.check_size, 'HxW', 'check size'),
                           1, device, args.seed))
            log(f'published port vs PosMLP-T at {size_name(c["size"])}: max '
                f'abs diff {c["max_abs_diff"]:.2e} '
                f'({"ok" if c["ok"] else "MISMATCH"})', start)
        macs = None if args.no_count else MacCounter(
            models, device, fake=not args.real_count, start=start)
        settings = [(mode, names if mode == 'fwd' else fwdbwd_names,
                     sizes if mode == 'fwd' else fwdbwd_sizes)
                    for mode in modes]
        report['results'], more = run_settings(
            models, settings, batches, args.repeats, args.warmup,
            args.warmup_each, device, mem_interval, calib_n, args.seed, macs,
            start)
        calibs += more
        if macs is not None:
            report['macs'] = macs.table
        if scaling_sizes and scaling_names:
            report['scaling'] = run_scaling(
                models, scaling_names, scaling_sizes, args.scaling_repeats,
                args.warmup, device, mem_interval, args.seed, start)
        del models, macs
        gc.collect()
        if device.type == 'cuda':
            torch.cuda.empty_cache()

    if proxy_steps:
        models = build_models(proxy_names, posmlp_arch, args.seed)
        if args.gpu_proxy_path == 'cuda' and device.type == 'cuda':
            for m in models.values():
                m.to(device)
        report['gpu_proxy'] = run_gpu_proxy(
            models, proxy_steps, device, args.gpu_proxy_path, seed=args.seed,
            start=start, bf16=not args.gpu_proxy_fp32_only)
        del models
        gc.collect()

    if cases:
        report['training'] = run_training(
            cases, args.train_repeats, args.train_warmup, device,
            train_memory, args.seed, posmlp_arch, mem_interval, start,
            flop_count=None if args.no_count else
            'real' if args.real_count else 'fake')

    if compile_shape:
        report['compile'] = [run_compiled(
            (batch, *compile_shape), compile_sizes, device,
            args.compile_backend, dynamic, 1, args.compile_repeats,
            args.seed, posmlp_arch, start) for batch, dynamic in compile_cases]

    if counted_steps:
        models = build_models(counted_names, posmlp_arch, args.seed)
        report['inductor_counts'] = run_inductor_counts(
            models, counted_steps, args.seed,
            log=lambda text: log(text, start))
        del models
        gc.collect()

    calibs.append(matmul_calibration(device, calib_n))
    peak = max(c['gflops'] for c in calibs)
    report['calibration'] = dict(
        start=calibs[0], end=calibs[-1], peak_gflops=peak,
        all_gflops=[c['gflops'] for c in calibs],
        note='peak_gflops: the fastest of all calibrations in this run (one '
             'at the start, one before every inference setting, one at the '
             'end)')
    log(f'matmul calibration at the end: {calibs[-1]["gflops"]:.1f} GFLOP/s;'
        f' range over the run {min(c["gflops"] for c in calibs):.1f} - '
        f'{peak:.1f}', start)
    for r in report['results']:
        if r.get('gflops_per_s') is not None:
            r['fraction_of_matmul'] = r['gflops_per_s'] / peak
    try:
        env['loadavg_end'] = os.getloadavg()
    except OSError:
        pass
    report['targets'] = target_lines(report)
    report['run_seconds'] = time.perf_counter() - start

    out = args.out
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(report, f, indent=1)
    md = write_outputs(report, out, not args.no_chart)
    print()
    print(md, flush=True)
    log(f'wrote {", ".join(report["files"].values())}', start)
    if args.update_doc:
        update_doc(report, out, args.update_doc)
    return report


if __name__ == '__main__':
    hide_known_third_party_warnings()
    main()
