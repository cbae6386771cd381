#!/usr/bin/env python
"""Speed, memory and cost of PosMLP backbones against Swin and ResNet-50.

All models run in one process, on the same input tensors, and their timed
runs are interleaved round by round, so that a machine whose speed drifts
(other jobs, clock changes) affects every model alike. Measured for every
(input size, batch, mode):

* median (and fastest) latency of a backbone forward (``fwd``: eval mode, no autograd) or
  forward + backward (``fwdbwd``: train mode, gradient of the mean of every
  output level), and images per second;
* peak memory of the call (see ``PeakMemory`` for how);
* parameters, and multiply-adds counted by ``torch.utils.flop_counter``
  (MACs = counted FLOPs / 2; it counts mm, addmm, bmm, baddbmm and
  convolutions, and einsum / matmul / ``@`` run as those, so the token
  mixing and Swin's attention matmuls are included);
* achieved GFLOP/s, also as a fraction of a large fp32 matmul timed in the
  same run (the calibration).

Models: ``posmlp_t``/``posmlp_s`` (this package), ``swin_t``/``swin_s`` and
``resnet50`` (built from mmdet's registry), and ``published_port``: the
PosMLP-T weights run the way the published code runs them (see
``PublishedPort``), the baseline the mixing is compared with.

A second part measures how forward latency grows with the input size
(square inputs, batch 1) and fits latency ~ pixels ** exponent.

Writes ``benchmark.json`` (every raw number and the environment),
``benchmark.png`` (chart) and ``benchmark.md`` (tables for the README).

Examples::

    python tools/benchmark.py                 # the full default run
    python tools/benchmark.py --quick         # a few minutes
    python tools/benchmark.py --sizes 800x1333 --batches 1 --modes fwd \\
        --models posmlp_t,swin_t,published_port --repeats 5

The benchmark changes no process-wide numeric setting (no flushing of
subnormal floats, no TF32 switches, torch's default thread count).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Dict, List, Optional

import torch

from posmlp_dense.bench.measure import (
    MEMORY_METHODS, MODES, PeakMemory, count_macs, environment, fit_exponent,
    loadavg, log, make_input, matmul_calibration, parse_size,
    run_interleaved, size_name, summarize)
from posmlp_dense.bench.models import ALL_MODELS, build_models, count_params
from posmlp_dense.bench.published_port import port_check
from posmlp_dense.bench.report import chart, fmt, markdown, target_lines


# Defaults: the full run takes about 11 minutes on an idle 2-core CPU (and
# two to five times as long while other jobs run); --quick is a subset of
# a few minutes. fwdbwd stops at 512x512: at 800x1333 a backward of
# PosMLP-S at batch 2 would need roughly 10 GB, extrapolated from 512x512
# (--fwdbwd-max-pixels 0 runs it anyway).
DEFAULTS = dict(
    models=','.join(ALL_MODELS), sizes='224,512,800x1333', batches='1,2',
    modes='fwd,fwdbwd', fwdbwd_models='posmlp_t,posmlp_s,swin_t,swin_s,'
    'resnet50', fwdbwd_max_pixels=512 * 512, repeats=5, warmup=1,
    scaling_sizes='512,800,1024,1333,1600', scaling_models='posmlp_t,swin_t',
    scaling_repeats=3)
QUICK = dict(
    models='posmlp_t,swin_t,resnet50,published_port', sizes='224,800x1333',
    batches='1', modes='fwd,fwdbwd', fwdbwd_models='posmlp_t,swin_t',
    fwdbwd_max_pixels=224 * 224, repeats=2, warmup=1, scaling_sizes='512,1024',
    scaling_models='posmlp_t,swin_t', scaling_repeats=2)



def parse_list(text: Optional[str]) -> List[str]:
    if text is None or text.strip().lower() in ('', 'none'):
        return []
    return [t.strip() for t in text.split(',') if t.strip()]



# ==================================================================== main
def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--quick', action='store_true',
                   help='a subset of a few minutes (explicit flags still '
                        'override it)')
    p.add_argument('--models', help=f'comma list from {",".join(ALL_MODELS)} '
                   f'(default: all; the fwdbwd and scaling runs take theirs '
                   f'from --fwdbwd-models and --scaling-models)')
    p.add_argument('--sizes', help='input sizes HxW or S (square), comma '
                   f'list (default {DEFAULTS["sizes"]})')
    p.add_argument('--batches', help=f'default {DEFAULTS["batches"]}')
    p.add_argument('--modes', help=f'fwd and/or fwdbwd (default '
                   f'{DEFAULTS["modes"]})')
    p.add_argument('--fwdbwd-models', help='models that also run fwdbwd '
                   f'(default {DEFAULTS["fwdbwd_models"]}; "all" for all)')
    p.add_argument('--fwdbwd-max-pixels', type=int, help='fwdbwd runs only '
                   'at the --sizes with at most this many pixels (default '
                   f'{DEFAULTS["fwdbwd_max_pixels"]}; 0: all sizes)')
    p.add_argument('--repeats', type=int, help='timed runs per model and '
                   f'setting (default {DEFAULTS["repeats"]})')
    p.add_argument('--warmup', type=int, help='untimed runs of every model '
                   'before the first batch of each size and mode (default '
                   f'{DEFAULTS["warmup"]})')
    p.add_argument('--warmup-each', action='store_true',
                   help='warm up before every batch, not only the first')
    p.add_argument('--scaling-sizes', help='square sizes of the scaling fit '
                   f'(default {DEFAULTS["scaling_sizes"]}; "none" to skip)')
    p.add_argument('--scaling-models', help='default '
                   f'{DEFAULTS["scaling_models"]}')
    p.add_argument('--scaling-repeats', type=int)
    p.add_argument('--check-size', default='224', help='size at which the '
                   'published port is checked against PosMLP-T ("none" to '
                   'skip); windows must tile every level')
    p.add_argument('--posmlp-arch', help='JSON dict: custom arch for posmlp_t '
                   'and the published port (for tests)')
    p.add_argument('--device', default='auto', choices=('auto', 'cpu',
                                                        'cuda'))
    p.add_argument('--calib-size', type=int, help='matmul calibration size '
                   '(default 2048 on CPU, 8192 on CUDA)')
    p.add_argument('--mem-interval-ms', type=float, default=1.0,
                   help='RSS sampling interval on CPU')
    p.add_argument('--no-count', action='store_true',
                   help='skip the MAC counting')
    p.add_argument('--real-count', action='store_true',
                   help='count MACs on real tensors (default: fake tensors, '
                        'same counts without the arithmetic)')
    p.add_argument('--no-chart', action='store_true')
    p.add_argument('--from-json', metavar='JSON',
                   help='run nothing: rewrite the Markdown and the chart of '
                        'an earlier run next to its JSON')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=os.path.join('work_dirs', 'benchmark',
                                                 'benchmark.json'))
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    for key, value in base.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def write_outputs(report: dict, out: str, with_chart: bool = True) -> str:
    """benchmark.md and benchmark.png next to ``out``; returns the table."""
    stem = os.path.splitext(out)[0]
    md = markdown(report)
    with open(stem + '.md', 'w') as f:
        f.write(md)
    report['files'] = dict(json=out, markdown=stem + '.md')
    if with_chart:
        chart(report, stem + '.png')
        report['files']['chart'] = stem + '.png'
    return md


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            report = json.load(f)
        for fit in report.get('scaling', {}).values():
            if 'exponent_min' not in fit and 'times' in fit:
                fit['min_s'] = [min(t) for t in fit['times']]
                fast = fit_exponent(fit['pixels'], fit['min_s'])
                fit['exponent_min'], fit['r2_min'] = fast['exponent'], \
                    fast['r2']
        report['targets'] = target_lines(report)
        print(write_outputs(report, args.from_json, not args.no_chart))
        return report
    start = time.perf_counter()
    if args.device == 'auto':
        device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    else:
        device = torch.device(args.device)
    names = parse_list(args.models)
    for n in names:
        if n not in ALL_MODELS:
            raise SystemExit(f'unknown model {n!r}; choose from '
                             f'{", ".join(ALL_MODELS)}')
    fb = parse_list(args.fwdbwd_models)
    fwdbwd_names = [n for n in names if 'all' in fb or n in fb]
    sizes = [parse_size(s) for s in parse_list(args.sizes)]
    fwdbwd_sizes = [s for s in sizes if args.fwdbwd_max_pixels <= 0
                    or s[0] * s[1] <= args.fwdbwd_max_pixels]
    batches = [int(b) for b in parse_list(args.batches)]
    modes = parse_list(args.modes)
    for m in modes:
        if m not in MODES:
            raise SystemExit(f'unknown mode {m!r}; choose from {MODES}')
    scaling_sizes = [parse_size(s) for s in parse_list(args.scaling_sizes)]
    scaling_names = [n for n in parse_list(args.scaling_models)]
    posmlp_arch = json.loads(args.posmlp_arch) if args.posmlp_arch else None
    mem_interval = args.mem_interval_ms / 1e3
    calib_n = args.calib_size or (8192 if device.type == 'cuda' else 2048)
    needed = list(dict.fromkeys(names + (scaling_names if scaling_sizes
                                         else [])))

    env = environment(device)
    log(f'torch {env["torch"]}, {env["threads"]} threads (torch default), '
        f'device {device}, CPU {env.get("cpu_model", "?")}')
    log(f'models {", ".join(needed)}; sizes '
        f'{", ".join(size_name(s) for s in sizes)}; batches {batches}; '
        f'modes {modes}; {args.repeats} repeats after {args.warmup} warm-up',
        start)
    models = build_models(needed, posmlp_arch, args.seed)
    for m in models.values():
        m.to(device)
    params = {n: count_params(m) for n, m in models.items()}
    with PeakMemory(device, mem_interval) as probe:
        pass
    mem_method = probe.method
    calib_start = matmul_calibration(device, calib_n)
    log(f'peak memory method: {mem_method}', start)
    log(f'matmul calibration: {calib_start["gflops"]:.1f} GFLOP/s', start)

    report = dict(
        config=dict(vars(args), models=names, sizes=[list(s) for s in sizes],
                    batches=batches, modes=modes, fwdbwd_models=fwdbwd_names,
                    fwdbwd_sizes=[list(s) for s in fwdbwd_sizes],
                    scaling_sizes=[list(s) for s in scaling_sizes],
                    scaling_models=scaling_names),
        environment=env, params=params,
        memory_method_key=mem_method,
        memory_method=MEMORY_METHODS[mem_method].format(
            interval=f'{args.mem_interval_ms:g}')
        + '; max over the timed runs',
        results=[], scaling={}, macs={})

    if ('posmlp_t' in models and 'published_port' in models
            and args.check_size.lower() != 'none'):
        report['port_check'] = port_check(
            models['posmlp_t'], models['published_port'],
            make_input(parse_size(args.check_size), 1, device, args.seed))
        c = report['port_check']
        verdict = 'ok' if c['ok'] else 'MISMATCH'
        log(f'published port vs PosMLP-T at {size_name(c["size"])}: max abs '
            f'diff {c["max_abs_diff"]:.2e} ({verdict})', start)

    macs_cache: Dict[tuple, Optional[int]] = {}

    def macs_of(name, size, mode):
        key = (name, size, mode)
        if args.no_count:
            return None
        if key not in macs_cache:
            total, by_op, how = count_macs(models[name], size, mode, device,
                                           fake=not args.real_count)
            macs_cache[key] = total
            report['macs'].setdefault(name, {}).setdefault(mode, {})[
                size_name(size)] = dict(gmacs=total / 1e9, flops_by_op=by_op,
                                        counted_on=how)
            log(f'counted {name} {size_name(size)} {mode}: '
                f'{total / 1e9:.2f} GMACs', start)
        return macs_cache[key]

    calibs = [calib_start]
    for mode in modes:
        mode_names = names if mode == 'fwd' else fwdbwd_names
        if not mode_names:
            continue
        for size in (sizes if mode == 'fwd' else fwdbwd_sizes):
            for bi, batch in enumerate(batches):
                x = make_input(size, batch, device, args.seed)
                macs = {n: macs_of(n, size, mode) for n in mode_names}
                what = f'{mode:<6s} {size_name(size):>9s} b{batch}'
                warmup = args.warmup if bi == 0 or args.warmup_each else 0
                local = matmul_calibration(device, calib_n, repeats=2)
                runs = run_interleaved(
                    models, [((n,), n, x) for n in mode_names], mode,
                    args.repeats, warmup, device, mem_interval,
                    lambda key: what, start)
                calibs.append(local)
                state = dict(calib_gflops_before=local['gflops'],
                             loadavg=loadavg())
                for n in mode_names:
                    r = summarize(runs[(n,)], batch, macs[n])
                    r.update(model=n, size=list(size), batch=batch, mode=mode,
                             params=params[n], **state)
                    report['results'].append(r)
                    log(f'{what}  {n:<15s} median {r["median_s"] * 1e3:9.1f}'
                        f' ms  {r["images_per_s"]:7.2f} img/s  peak '
                        f'{fmt(r["peak_mem_mb"], ".0f")} MB', start)
                del x

    if scaling_sizes and scaling_names:
        # one set of rounds over every (size, model): a drift of the
        # machine's speed during the sweep does not bend the curve
        inputs = {s: make_input(s, 1, device, args.seed)
                  for s in scaling_sizes}
        jobs = [((s, n), n, inputs[s]) for s in scaling_sizes
                for n in scaling_names]
        runs = run_interleaved(
            models, jobs, 'fwd', args.scaling_repeats, args.warmup, device,
            mem_interval, lambda key: f'scaling {size_name(key[0]):>9s} b1',
            start)
        del inputs
        for n in scaling_names:
            pixels = [h * w for h, w in scaling_sizes]
            med = [statistics.median(runs[(s, n)]['times'])
                   for s in scaling_sizes]
            fastest = [min(runs[(s, n)]['times']) for s in scaling_sizes]
            fit = fit_exponent(pixels, med)
            fit_min = fit_exponent(pixels, fastest)
            report['scaling'][n] = dict(
                sizes=[list(s) for s in scaling_sizes], pixels=pixels,
                median_s=med, min_s=fastest,
                times=[runs[(s, n)]['times'] for s in scaling_sizes],
                exponent_min=fit_min['exponent'], r2_min=fit_min['r2'], **fit)
            log(f'scaling {n}: latency ~ pixels^{fmt(fit["exponent"], ".3f")}'
                f' (R^2 {fmt(fit["r2"], ".3f")})', start)

    calib_end = matmul_calibration(device, calib_n)
    calibs.append(calib_end)
    peak = max(c['gflops'] for c in calibs)
    report['calibration'] = dict(
        start=calib_start, end=calib_end, peak_gflops=peak,
        all_gflops=[c['gflops'] for c in calibs],
        note='peak_gflops: the fastest of all calibrations in this run (one '
             'at the start, one before every setting, one at the end)')
    log(f'matmul calibration at the end: {calib_end["gflops"]:.1f} GFLOP/s; '
        f'range over the run {min(c["gflops"] for c in calibs):.1f} - '
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
    return report


if __name__ == '__main__':
    main()
