"""The performance page's CPU table: PosMLP-T against Swin-T, step by
step, from one benchmark run that times both (inference settings and
backbone training steps), with the machine and its load."""
from __future__ import annotations

from typing import List, Optional

from .measure import fmt, size_name
from .report import busy_warning, commit_text, find


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return '-'
    return f'{value * 1e3:,.0f} ms' if value < 1 else f'{value:.3f} s'


def _ratios(entry: dict, name: str) -> str:
    """'median (fastest; paired, rounds low-high)' of a targets entry."""
    text = f"{entry[name]:.2f} ({fmt(entry.get(name + '_min'), '.2f')}; " \
        f"paired {fmt(entry.get(name + '_paired'), '.2f')}"
    spread = entry.get(name + '_range')
    if spread:
        text += f', rounds {spread[0]:.2f}-{spread[1]:.2f}'
    return text + ')'


def like_for_like_markdown(report: dict, heading: str = '###') -> List[str]:
    """A row per inference setting and per backbone training step that
    the run timed for both PosMLP-T and Swin-T: both medians, the ratio
    (from the medians, the fastest runs and paired round by round) and
    the peak-memory ratio where it was measured. Empty when the run has
    no such pair."""
    targets = report.get('targets') or {}
    inference = targets.get('posmlp_vs_swin') or []
    training = [e for e in targets.get('training') or []
                if e['kind'] == 'backbone']
    if not (inference or training):
        return []
    env = report.get('environment', {})
    load = [(env.get(k) or [None])[0] for k in ('loadavg_start',
                                                 'loadavg_end')]
    lines = [
        '', f'{heading} CPU time against Swin-T', '',
        f"At commit {commit_text(env)}, {env.get('time', '?')}, torch "
        f"{env.get('torch', '?')} on {env.get('cpu_model', '?')} "
        f"({env.get('threads', '?')} threads, fp32); load average "
        f"{fmt(load[0], '.1f')} at the start, {fmt(load[1], '.1f')} at the "
        f"end. Ratios PosMLP-T / Swin-T, below 1 is better: from the "
        f"medians (from the fastest runs; paired: the median of the rounds' "
        f"ratios, and their range)."]
    settings = env.get('allocator')
    if settings:  # the runs compare only with runs under the same ones
        lines[-1] += ' Allocator settings: ' + ', '.join(
            f'`{k}={v}`' for k, v in sorted(settings.items())) + '.'
    warning = busy_warning(report)
    if warning:
        lines += ['', warning]
    lines += ['', '| step | PosMLP-T | Swin-T | time ratio | peak memory '
              'ratio |', '| --- | ---: | ---: | --- | ---: |']
    results = report.get('results') or []
    for e in inference:
        ours = find(results, 'posmlp_t', e['size'], e['batch'], e['mode'])
        theirs = find(results, 'swin_t', e['size'], e['batch'], e['mode'])
        mode = 'inference' if e['mode'] == 'fwd' else 'forward and backward'
        lines.append(
            f"| {mode} {e['batch']}x3x{size_name(e['size'])} | "
            f"{_seconds(ours['median_s'])} | {_seconds(theirs['median_s'])} "
            f"| {_ratios(e, 'latency_ratio')} | "
            f"{fmt(e.get('peak_mem_ratio'), '.2f')} |")
    rows = report.get('training') or []
    for e in training:
        pair = [next(r for r in rows if r['model'] == name and
                     (r['kind'], r['shape'], r['with_cp']) ==
                     (e['kind'], e['shape'], e['with_cp']))
                for name in ('posmlp_t', 'swin_t')]
        batch, height, width = e['shape']
        cp = ', with_cp' if e['with_cp'] else ''
        lines.append(
            f"| training {batch}x3x{height}x{width}{cp} | "
            f"{_seconds(pair[0]['median_s'])} | "
            f"{_seconds(pair[1]['median_s'])} | "
            f"{_ratios(e, 'time_ratio')} | "
            f"{fmt(e.get('peak_first_step_ratio'), '.2f')} |")
    return lines
