#!/usr/bin/env python
"""The measuring kit's one command line (docs/performance.md): each part
writes a JSON report, prints its Markdown, and with --update-doc rewrites
the generated sections of a page.

    python tools/benchmark.py time [--models posmlp_t,swin_t] \\
        [--steps inference:1x800x1333,train:2x512x512]
    python tools/benchmark.py gpu-proxy [--fp32-only]
    python tools/benchmark.py compile [--shape 512x512] [--cases 1:true,...]
    python tools/benchmark.py inductor-counts
    python tools/benchmark.py versions --base HEAD~1 [--mode inference]
    python tools/benchmark.py render JSON [JSON ...] --update-doc PAGE

No part changes a process-wide numeric setting; ``time
--keep-freed-memory`` runs itself again in a child whose glibc malloc
keeps freed memory, and the report says so.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import torch

from benchmarks.cli_sizes import parse_dims
from benchmarks.doc_sections import update_file, update_sections
from benchmarks.environment import (
    SOURCE_ROOT, environment, environment_keeping_freed_memory,
    keeps_freed_memory)
from benchmarks.models import ALL_MODELS, LABELS, build_models
from benchmarks.steps import STEP_MODES
from benchmarks.tables import sections, timed_rows

TOOL = 'tools/benchmark.py render'
# the generated section each measuring part writes
PART_SECTIONS = {'time': 'cpu-vs-swin', 'gpu-proxy': 'gpu-proxy',
                 'compile': 'compile', 'inductor-counts': 'inductor-counts'}


def _sizes(layout: str):
    """An argparse type: a comma list of sizes written as ``layout``."""
    def parse(text: str):
        return [parse_dims(s, layout, square=True)
                for s in text.split(',') if s.strip()]
    return parse


def _steps(text: str):
    """'MODE:BxHxW,...' -> [(mode, (B, H, W))]."""
    steps = []
    for item in text.split(','):
        mode, _, shape = item.strip().partition(':')
        if mode not in STEP_MODES:
            raise argparse.ArgumentTypeError(
                f'{item!r}: expected MODE:BxHxW, MODE one of '
                f'{", ".join(STEP_MODES)}')
        steps.append((mode, parse_dims(shape, 'BxHxW')))
    return steps


def _models(text: str) -> List[str]:
    names = [n.strip() for n in text.split(',') if n.strip()]
    for name in names:
        if name not in ALL_MODELS:
            raise argparse.ArgumentTypeError(
                f'unknown model {name}; choose from {", ".join(ALL_MODELS)}')
    return names


def _cases(text: str):
    """'BATCH:DYNAMIC,...' -> [(batch, True or None)]."""
    cases = []
    for item in text.split(','):
        batch, _, dynamic = item.strip().partition(':')
        if not batch.isdigit() or int(batch) < 1 or \
                dynamic.lower() not in ('true', 'none'):
            raise argparse.ArgumentTypeError(
                f'{item!r}: write BATCH:true or BATCH:none, as in 2:none')
        cases.append((int(batch), True if dynamic.lower() == 'true'
                      else None))
    return cases


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split('\n\n', 1)[1])
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('--out', help='the JSON report (default '
                        'work_dirs/benchmark/PART.json)')
    common.add_argument('--update-doc', metavar='PAGE', help="rewrite the "
                        "page's generated section of this part")
    common.add_argument('--seed', type=int, default=0)
    common.add_argument('--device', default='auto',
                        choices=('auto', 'cpu', 'cuda'))
    common.add_argument('--posmlp-arch', type=json.loads, help='a JSON '
                        "arch dict for PosMLP-T (tests' tiny models)")
    parts = p.add_subparsers(dest='part', required=True)

    t = parts.add_parser('time', parents=[common], help='time and peak '
                         'memory of steps, models interleaved')
    t.add_argument('--models', type=_models, default='posmlp_t,swin_t')
    t.add_argument('--steps', type=_steps, default='inference:1x800x1333,'
                   'train:2x512x512,train:1x800x1333', help='MODE:BxHxW '
                   'comma list, MODE inference or train (default %(default)s)')
    t.add_argument('--repeats', type=int, default=5)
    t.add_argument('--warmup', type=int, default=1)
    t.add_argument('--compile', nargs='?', const='inductor', metavar='BACKEND',
                   help='also time each model under torch.compile with this '
                   'backend (default inductor), static shapes, interleaved '
                   'with eager; its first call, which compiles, is a warmup')
    t.add_argument('--keep-freed-memory', action='store_true',
                   help='run in a child whose malloc keeps freed memory '
                   '(glibc): no step pays page faults for fresh memory, as '
                   'on a GPU with its caching allocator')

    g = parts.add_parser('gpu-proxy', parents=[common], help='operations, '
                         'bytes, host syncs and FLOPs per step, and the '
                         'time they imply on an H200')
    from benchmarks.gpu_proxy import MODELS, STEPS
    g.add_argument('--models', type=_models, default=','.join(MODELS))
    g.add_argument('--steps', type=_steps, default=','.join(
        f"{mode}:{'x'.join(map(str, shape))}" for mode, shape in STEPS))
    g.add_argument('--fp32-only', action='store_true',
                   help='not also under bfloat16 autocast (half the time)')

    c = parts.add_parser('compile', parents=[common], help="PosMLP-T's "
                         'training step under torch.compile')
    c.add_argument('--shape', type=lambda s: parse_dims(s, 'HxW', True),
                   default='512x512', help='HxW of the timed step')
    c.add_argument('--cases', type=_cases, default='1:true,2:true,1:none,'
                   '2:none', help="BATCH:DYNAMIC comma list, DYNAMIC "
                   "torch.compile's argument, true or none (default "
                   '%(default)s)')
    c.add_argument('--sizes', type=_sizes('HxW'), default='480x544,544x480,'
                   '448x608,576x416,512x640,608x512', help='further HxW '
                   'sizes, each of which must reuse its graph')
    c.add_argument('--backend', default='inductor')
    c.add_argument('--repeats', type=int, default=3)

    i = parts.add_parser('inductor-counts', parents=[common],
                         help='kernels and bytes of steps compiled by '
                         'inductor, beside the eager counts')
    i.add_argument('--models', type=_models, default='posmlp_t,swin_t')
    i.add_argument('--steps', type=_steps,
                   default='inference:1x800x1333,inference:1x512x512,'
                   'inference:1x448x672,train:2x512x512')
    i.add_argument('--freezing', action='store_true',
                   help="also count each inference step compiled with "
                   "inductor's freezing (parameters as constants)")

    v = parts.add_parser('versions', parents=[common], help="this "
                         "checkout's PosMLP against a commit's, paired")
    v.add_argument('--base', required=True, help='a git revision')
    v.add_argument('--mode', choices=tuple(STEP_MODES), default='train')
    v.add_argument('--shape', type=lambda s: parse_dims(s, 'BxCxHxW'),
                   default='2x3x512x512')
    v.add_argument('--rounds', type=int, default=8)
    v.add_argument('--warmup', type=int, default=1)

    r = parts.add_parser('render', help='the Markdown of reports, and '
                         'their sections of --update-doc PAGE')
    r.add_argument('json', nargs='+')
    r.add_argument('--update-doc', metavar='PAGE')

    args = p.parse_args(argv)
    if args.part == 'time' and args.compile and args.warmup < 1:
        p.error('--compile needs --warmup 1 or more: the first call of a '
                'compiled model compiles it')
    if args.part in PART_SECTIONS and args.update_doc:
        check_page(args.update_doc, [PART_SECTIONS[args.part]], p.error)
    if args.part != 'render':
        args.out = args.out or os.path.join('work_dirs', 'benchmark',
                                            f'{args.part}.json')
        if os.path.isdir(args.out):
            p.error(f'--out {args.out}: a folder, not a JSON file path')
    return args


def check_page(page: str, names: List[str], error):
    """Before minutes of measuring: the page has the sections' markers."""
    try:
        with open(page, encoding='utf-8') as f:
            update_sections(f.read(), {name: '' for name in names}, page)
    except (OSError, ValueError) as err:
        error(f'--update-doc {page}: {err}')


def choose_device(name: str) -> torch.device:
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    if name == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(f'--device cuda: torch {torch.__version__} sees no '
                         f'CUDA device')
    return torch.device(name)


def run_keeping_freed_memory(argv) -> None:
    """This command again, in a child started with the malloc settings
    (glibc reads them when a process starts)."""
    try:
        env = environment_keeping_freed_memory()
    except RuntimeError as err:
        raise SystemExit(f'--keep-freed-memory: {err}') from None
    # the child imports this checkout, not an installed copy
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (SOURCE_ROOT, env.get('PYTHONPATH')) if p)
    argv = sys.argv[1:] if argv is None else list(argv)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), *argv],
                          env=env)
    if done.returncode:
        raise SystemExit(f'the run keeping freed memory failed (exit '
                         f'status {done.returncode})')


def measure(args, device: torch.device, log) -> dict:
    """The part's figures, under the report's key."""
    if args.part == 'time':
        from benchmarks.timed_steps import time_steps
        models = {n: m.to(device) for n, m in build_models(
            args.models, args.posmlp_arch, args.seed).items()}
        labels = dict(LABELS)
        if args.compile:
            for name, model in list(models.items()):
                models[f'{name}_compiled'] = torch.compile(
                    model, backend=args.compile, dynamic=False)
                labels[f'{name}_compiled'] = \
                    f'{LABELS.get(name, name)}, compiled ({args.compile})'
        return dict(results=time_steps(models, args.steps, args.repeats,
                                       args.warmup, device, args.seed, log,
                                       labels))
    if args.part == 'gpu-proxy':
        from benchmarks.gpu_proxy import run_gpu_proxy
        models = {n: m.to(device) for n, m in build_models(
            args.models, args.posmlp_arch, args.seed).items()}
        return dict(gpu_proxy=run_gpu_proxy(
            models, args.steps, device, seed=args.seed,
            bf16=not args.fp32_only, log=log))
    if args.part == 'compile':
        from benchmarks.gpu_check.compiled import compiled_step
        from posmlp_dense import PosMLP
        cases = []
        for batch, dynamic in args.cases:
            torch.manual_seed(args.seed)
            # no stochastic depth: eager and compiled run the same network
            model = PosMLP(args.posmlp_arch or 't', out_indices=(0, 1, 2, 3),
                           drop_path_rate=0.0)
            log(f'compiling ({args.backend}, dynamic={dynamic}) at batch '
                f'{batch}')
            verdict = compiled_step(model, (batch, *args.shape), device,
                                    args.backend, 1, args.repeats, args.seed,
                                    args.sizes, dynamic=dynamic)
            log(('ok: ' if verdict.passed else 'FAILED: ') + verdict.detail)
            cases.append(dict(
                passed=verdict.passed, detail=verdict.detail,
                label='PosMLP-T' if args.posmlp_arch is None else
                'PosMLP (custom arch)', **verdict.figures))
        return dict(compile=cases)
    if args.part == 'inductor-counts':
        from benchmarks.inductor_counts import run_inductor_counts
        return dict(inductor_counts=run_inductor_counts(
            build_models(args.models, args.posmlp_arch, args.seed),
            args.steps, args.seed, log, args.freezing))
    from benchmarks.versions import compare_versions
    result = compare_versions(args.base, args.mode, args.shape,
                              args.posmlp_arch or 't', args.rounds,
                              args.warmup, args.seed, log)
    low, high = result['ratio_range']
    log(f"this checkout / {args.base}: {result['ratio_paired']:.3f} (paired; "
        f"rounds {low:.3f}-{high:.3f}); medians "
        f"{result['current_median_s']:.3f} s / {result['base_median_s']:.3f} "
        f"s; outputs agree to {result['max_relative_difference']:.1e}")
    return dict(versions=result)


def markdown(reports: List[dict]) -> Dict[str, str]:
    """The sections of the reports, and a table of their timed rows."""
    out = sections(reports)
    for report in reports:
        rows = timed_rows(report)
        if rows:
            out.setdefault('timed rows', rows)
    return out


def write_sections(found: Dict[str, str], page: str, source: str):
    documented = {k: v for k, v in found.items() if k != 'timed rows'}
    if not documented:
        raise SystemExit(f'--update-doc: {source} has no figures of a '
                         f'generated section')
    try:
        update_file(page, documented, source, tool=TOOL)
    except ValueError as err:
        raise SystemExit(f'--update-doc {page}: {err}') from None
    print(f'rewrote the sections {", ".join(documented)} of {page}')


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.part == 'render':
        reports = []
        for path in args.json:
            with open(path) as f:
                reports.append(json.load(f))
        found = markdown(reports)
        for name, text in found.items():
            print(f'## {name}\n\n{text}\n')
        if args.update_doc:
            write_sections(found, args.update_doc,
                           ' and '.join(map(os.path.relpath, args.json)))
        return found
    if args.part == 'time' and args.keep_freed_memory and \
            not keeps_freed_memory():
        run_keeping_freed_memory(argv)  # writes args.out
        with open(args.out) as f:
            return json.load(f)
    start = time.perf_counter()

    def log(text: str):
        print(f'[{time.perf_counter() - start:7.1f}s] {text}', flush=True)
    device = choose_device(args.device)
    report = dict(part=args.part, config={
        k: v for k, v in vars(args).items() if k not in ('part', 'out',
                                                        'update_doc')},
        environment=environment(device))
    report.update(measure(args, device, log))
    if hasattr(os, 'getloadavg'):
        report['environment']['loadavg_end'] = os.getloadavg()
    report['run_seconds'] = time.perf_counter() - start
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(report, f, indent=1)
    found = markdown([report])
    for name, text in found.items():
        print(f'\n## {name}\n\n{text}')
    log(f'wrote {args.out}')
    if args.update_doc:
        write_sections(found, args.update_doc, os.path.relpath(args.out))
    return report


if __name__ == '__main__':
    from posmlp_dense.known_warnings import hide_known_third_party_warnings
    hide_known_third_party_warnings()
    main()
