"""The benchmark's report: target ratios, Markdown tables and the chart."""
from __future__ import annotations

import math
from typing import Optional

from .measure import MODES, size_name
from .models import ALL_MODELS, LABELS


def find(results, model, size, batch, mode):
    for r in results:
        if (r['model'], tuple(r['size']), r['batch'], r['mode']) == (
                model, tuple(size), batch, mode):
            return r
    return None


def target_lines(report: dict) -> dict:
    """Ratios for the targets of issue 6.

    Each ratio from the medians (what the targets are judged on) and from
    the fastest runs (``*_min``): on a busy machine other processes only
    ever slow a run down, so the fastest runs are the steadier estimate.
    """
    res = report['results']
    det = (800, 1333)
    out = dict(posmlp_vs_swin=[], posmlp_vs_port=[], scaling={})
    for r in res:
        if r['model'] != 'posmlp_t':
            continue
        swin = find(res, 'swin_t', r['size'], r['batch'], r['mode'])
        if swin is not None:
            lat = r['median_s'] / swin['median_s']
            mem = (r['peak_mem_mb'] / swin['peak_mem_mb']
                   if r['peak_mem_mb'] and swin['peak_mem_mb'] else None)
            entry = dict(size=r['size'], batch=r['batch'], mode=r['mode'],
                         latency_ratio=lat,
                         latency_ratio_min=r['min_s'] / swin['min_s'],
                         peak_mem_ratio=mem)
            if tuple(r['size']) == det and r['mode'] == 'fwd':
                entry['target'] = 'latency ratio <= 1.0, memory ratio <= 1.0'
                entry['met'] = lat <= 1.0 and (mem is None or mem <= 1.0)
            out['posmlp_vs_swin'].append(entry)
        port = find(res, 'published_port', r['size'], r['batch'], r['mode'])
        if port is not None:
            speedup = port['median_s'] / r['median_s']
            entry = dict(size=r['size'], batch=r['batch'], mode=r['mode'],
                         speedup=speedup,
                         speedup_min=port['min_s'] / r['min_s'])
            if r['mode'] == 'fwd':
                entry['target'] = 'speedup >= 1.5'
                entry['met'] = speedup >= 1.5
            out['posmlp_vs_port'].append(entry)
    for name, s in report.get('scaling', {}).items():
        out['scaling'][name] = dict(exponent=s['exponent'], r2=s['r2'],
                                    exponent_min=s.get('exponent_min'))
    return out


def busy_warning(report: dict) -> Optional[str]:
    """A warning when the machine was visibly busy during the run."""
    env, cal = report['environment'], report['calibration']
    speeds = cal.get('all_gflops') or [cal['peak_gflops']]
    loads = [v[0] for v in (env.get('loadavg_start'), env.get('loadavg_end'))
             if v]
    loads += [r['loadavg'][0] for r in report['results'] if r.get('loadavg')]
    cores = env.get('cpu_count') or 1
    spread = max(speeds) / max(min(speeds), 1e-9)
    if env['device'] == 'cpu' and (spread > 1.5 or (loads and max(loads)
                                                    > 1.5 * cores)):
        return (f"**The machine was busy during this run** (load average up "
                f"to {max(loads):.1f} on {cores} cores; the matmul "
                f"calibration ranged {min(speeds):.1f}-{max(speeds):.1f} "
                f"GFLOP/s): latencies are inflated and noisy, and a run "
                f"that caught a quiet moment can make even the fastest-run "
                f"figures lopsided. Re-run on an idle machine before "
                f"drawing conclusions.")
    return None


def fmt(value, spec, missing='-'):
    return missing if value is None else format(value, spec)


def markdown(report: dict) -> str:
    env, cal = report['environment'], report['calibration']
    cal.setdefault('all_gflops', [cal['peak_gflops']])
    cfg = report['config']
    load = [(env.get(k) or [None])[0] for k in ('loadavg_start',
                                                 'loadavg_end')]
    lines = [
        '### Backbone benchmark', '',
        f"- Machine: {env.get('cpu_model', '?')}, {env['threads']} torch "
        f"threads (torch's default), torch {env['torch']}, device "
        f"{env['device']}"
        + (f" ({env['cuda_device']})" if env.get('cuda_device') else '')
        + f"; load average {fmt(load[0], '.1f')} at the start, "
        f"{fmt(load[1], '.1f')} at the end.",
        f"- Matmul calibration ({cal['start']['n']}^3 fp32 `torch.mm`): "
        f"fastest {cal['peak_gflops']:.1f} GFLOP/s, slowest "
        f"{min(cal['all_gflops']):.1f} of {len(cal['all_gflops'])} "
        f"measured during the run; \"% of matmul\" is against the fastest.",
        f"- Median of {cfg['repeats']} timed runs per model, interleaved "
        f"round by round on the same input, after {cfg['warmup']} warm-up "
        f"run(s); random initialization.",
        "- fwd: eval mode without autograd; fwdbwd: train mode, forward and "
        "backward of the mean of every output level.",
        "- GMACs per image: `torch.utils.flop_counter` FLOPs / 2 at batch 1 "
        "(convolutions, linear layers and every matmul, the token mixing "
        "included).",
        f"- Peak memory: {report['memory_method']}.", '',
        '| model | input | batch | mode | median (ms) | min (ms) | images/s '
        '| peak mem (MB) | params (M) | GMACs/img | GFLOP/s | % of matmul |',
        '| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: '
        '| ---: | ---: |']
    warning = busy_warning(report)
    if warning:
        lines[2:2] = [warning, '']
    for r in report['results']:
        share = r.get('fraction_of_matmul')
        share = None if share is None else 100 * share
        lines.append(
            f"| {LABELS.get(r['model'], r['model'])} | {size_name(r['size'])}"
            f" | {r['batch']} | {r['mode']} | {r['median_s'] * 1e3:.1f} | "
            f"{r['min_s'] * 1e3:.1f} | {r['images_per_s']:.2f} | "
            f"{fmt(r['peak_mem_mb'], '.0f')} | "
            f"{r['params'] / 1e6:.1f} | "
            f"{fmt(r.get('gmacs_per_image'), '.2f')} | "
            f"{fmt(r.get('gflops_per_s'), '.1f')} | {fmt(share, '.0f')} |")
    t = report['targets']
    if t['posmlp_vs_swin'] or t['posmlp_vs_port']:
        lines += ['', 'PosMLP-T against Swin-T (latency and peak-memory '
                  'ratios, below 1 is better) and against the published port '
                  '(speedup); median and, in brackets, from the fastest runs:',
                  '', '| PosMLP-T against | input | batch | mode | '
                  'latency ratio | peak-memory ratio | speedup | target |',
                  '| --- | --- | ---: | --- | ---: | ---: | ---: | --- |']

        def verdict(e):
            if 'met' not in e:
                return ''
            return f"{e['target']} ({'met' if e['met'] else 'NOT met'})"
        for e in t['posmlp_vs_swin']:
            lines.append(
                f"| Swin-T | {size_name(e['size'])} | {e['batch']} | "
                f"{e['mode']} | {e['latency_ratio']:.2f} "
                f"({fmt(e.get('latency_ratio_min'), '.2f')}) | "
                f"{fmt(e['peak_mem_ratio'], '.2f')} | - | {verdict(e)} |")
        for e in t['posmlp_vs_port']:
            lines.append(
                f"| published port | {size_name(e['size'])} | {e['batch']} | "
                f"{e['mode']} | {1 / e['speedup']:.2f} | - | "
                f"{e['speedup']:.2f}x ({fmt(e.get('speedup_min'), '.2f')}x) "
                f"| {verdict(e)} |")
    if report.get('scaling'):
        sizes = None
        rows = []
        for name, s in report['scaling'].items():
            sizes = s['sizes']
            rows.append(
                f"| {LABELS.get(name, name)} | "
                + ' | '.join(f'{v * 1e3:.0f}' for v in s['median_s'])
                + f" | {fmt(s['exponent'], '.2f')} (R^2 "
                f"{fmt(s['r2'], '.2f')}) | "
                f"{fmt(s.get('exponent_min'), '.2f')} (R^2 "
                f"{fmt(s.get('r2_min'), '.2f')}) |")
        lines += ['', 'Forward latency (median ms, batch 1) against input '
                  'size, and the exponent k of latency ~ pixels^k (least '
                  'squares in log-log; 1.0 is linear in pixels), from the '
                  'medians and from the fastest runs:', '',
                  '| model | ' + ' | '.join(size_name(s) for s in sizes)
                  + ' | k (medians) | k (fastest) |',
                  '| --- | ' + ' | '.join('---:' for _ in sizes)
                  + ' | ---: | ---: |'] + rows
    if report.get('port_check'):
        c = report['port_check']
        lines += ['', f"Published port against PosMLP-T at "
                  f"{size_name(c['size'])}: largest output difference "
                  f"{c['max_abs_diff']:.2e} (outputs up to "
                  f"{c['max_abs_output']:.1f})."]
    lines += ['', f"Run time: {report['run_seconds'] / 60:.1f} min."]
    return '\n'.join(lines) + '\n'


def chart(report: dict, path: str):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    res = report['results']
    modes = [m for m in MODES if any(r['mode'] == m for r in res)]
    panels = len(modes) + (1 if report.get('scaling') else 0)
    if panels == 0:
        return
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.8),
                             squeeze=False)
    axes = axes[0]
    colors = {n: f'C{i}' for i, n in enumerate(ALL_MODELS)}
    for ax, mode in zip(axes, modes):
        names = [n for n in ALL_MODELS
                 if any(r['model'] == n and r['mode'] == mode for r in res)]
        groups = []
        for r in res:
            key = (tuple(r['size']), r['batch'])
            if r['mode'] == mode and key not in groups:
                groups.append(key)
        width = 0.8 / max(len(names), 1)
        lowest = math.inf
        for j, name in enumerate(names):
            xs, ys = [], []
            for g, (size, batch) in enumerate(groups):
                r = find(res, name, size, batch, mode)
                if r is not None:
                    xs.append(g + (j - (len(names) - 1) / 2) * width)
                    ys.append(r['median_s'] * 1e3)
            if xs:
                ax.bar(xs, ys, width, label=LABELS[name], color=colors[name])
                lowest = min(lowest, min(ys))
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f'{size_name(s)}\nb{b}' for s, b in groups])
        ax.set_yscale('log')
        if lowest < math.inf:
            ax.set_ylim(bottom=lowest / 3)
        ax.set_ylabel('median latency (ms, log)')
        ax.set_title(f'backbone {mode}')
        ax.grid(axis='y', alpha=0.3)
        ax.legend(fontsize=8)
    if report.get('scaling'):
        ax = axes[-1]
        for name, s in report['scaling'].items():
            px = [h * w for h, w in s['sizes']]
            ax.loglog(px, s['median_s'], 'o-', color=colors.get(name),
                      label=f"{LABELS.get(name, name)} "
                            f"(k={fmt(s['exponent'], '.2f')})")
        if report['scaling']:
            first = next(iter(report['scaling'].values()))
            px = [h * w for h, w in first['sizes']]
            ref = [first['median_s'][0] * p / px[0] for p in px]
            ax.loglog(px, ref, 'k:', label='linear in pixels')
        ax.set_xlabel('pixels')
        ax.set_ylabel('forward latency (s), batch 1')
        ax.set_title('latency ~ pixels^k')
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

