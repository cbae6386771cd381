"""PosMLP-T against Swin-T: the ratios of a report's rows (below 1 is
better), and issue 30's verdicts on the GPU-proxy counts."""
from __future__ import annotations

import statistics
from typing import List, Optional

# Issue 30, PosMLP-T against Swin-T at every GPU-proxy step: operations
# at most these multiples of Swin-T's, bytes written at most this one, and
# no host sync.
GPU_PROXY_OPS_LIMIT = {'inference': 1.0, 'train': 1.5}
GPU_PROXY_BYTES_LIMIT = 1.0


def ratio(a, b) -> Optional[float]:
    return a / b if a is not None and b else None


def time_ratios(ours: dict, theirs: dict, name: str) -> dict:
    """``name`` from the medians, ``name``_min from the fastest runs,
    ``name``_paired the median of the rounds' ratios (the two ran back to
    back, so a drift of the machine's speed cancels out of each) and
    ``name``_range their lowest and highest."""
    rounds = [a / b for a, b in zip(ours['times'], theirs['times'])] \
        if len(ours['times']) == len(theirs['times']) else []
    return {name: ours['median_s'] / theirs['median_s'],
            f'{name}_min': ours['min_s'] / theirs['min_s'],
            f'{name}_paired': statistics.median(rounds) if rounds else None,
            f'{name}_range': [min(rounds), max(rounds)] if rounds else None}


def posmlp_against_swin(rows: List[dict], key):
    """(PosMLP-T's row, Swin-T's row) of every ``key`` both have."""
    swin = {key(r): r for r in rows if r['model'] == 'swin_t'}
    return [(r, swin[key(r)]) for r in rows
            if r['model'] == 'posmlp_t' and key(r) in swin]


def inference_targets(results: List[dict]) -> List[dict]:
    return [dict(size=r['size'], batch=r['batch'], mode=r['mode'],
                 **time_ratios(r, s, 'latency_ratio'),
                 peak_mem_ratio=ratio(r.get('peak_mem_mb'),
                                      s.get('peak_mem_mb')))
            for r, s in posmlp_against_swin(results, lambda r: (
                tuple(r['size']), r['batch'], r['mode']))]


def training_targets(rows: List[dict]) -> List[dict]:
    return [dict(kind=r['kind'], shape=r['shape'], with_cp=r['with_cp'],
                 **time_ratios(r, s, 'time_ratio'),
                 peak_ratio=ratio(r.get('peak_mb'), s.get('peak_mb')),
                 peak_first_step_ratio=ratio(r.get('peak_first_step_mb'),
                                             s.get('peak_first_step_mb')),
                 saved_ratio=ratio(r.get('saved_activation_mb_per_image'),
                                   s.get('saved_activation_mb_per_image')))
            for r, s in posmlp_against_swin(rows, lambda r: (
                r['kind'], tuple(r['shape']), r['with_cp']))]


def gpu_proxy_targets(rows: List[dict]) -> List[dict]:
    """Ratios of operations, bytes written, FLOPs and the estimate, each
    model's host syncs, and issue 30's verdict (``missed``: what is over),
    judged on the fp32 counts; the bf16 ratios too where counted."""
    out = []
    for r, s in posmlp_against_swin(
            rows, lambda r: (r['mode'], tuple(r['shape']))):
        limit = GPU_PROXY_OPS_LIMIT[r['mode']]
        entry = dict(mode=r['mode'], shape=r['shape'],
                     ops_ratio=ratio(r['ops'], s['ops']),
                     bytes_ratio=ratio(r['bytes_written'],
                                       s['bytes_written']),
                     flop_ratio=ratio(r['flops'], s['flops']),
                     estimate_ratio=ratio(r['estimate_s'], s['estimate_s']),
                     syncs=[r['syncs'], s['syncs']])
        if r.get('bf16') and s.get('bf16'):
            for key in ('ops', 'bytes_written', 'estimate_s'):
                name = {'bytes_written': 'bytes', 'estimate_s': 'estimate'
                        }.get(key, key)
                entry[f'{name}_ratio_bf16'] = ratio(r['bf16'][key],
                                                    s['bf16'][key])
        missed = []
        if entry['ops_ratio'] is None or entry['ops_ratio'] > limit:
            missed.append(f"ops {entry['ops_ratio']:.2f}x")
        if entry['bytes_ratio'] is None or \
                entry['bytes_ratio'] > GPU_PROXY_BYTES_LIMIT:
            missed.append(f"bytes written {entry['bytes_ratio']:.2f}x")
        if r['syncs']:
            missed.append(f"{r['syncs']} host syncs")
        entry.update(target=f'ops <= {limit:.2f}x Swin-T, bytes written <= '
                            f'{GPU_PROXY_BYTES_LIMIT:.2f}x, host syncs 0',
                     met=not missed, missed=missed)
        out.append(entry)
    return out


def verdict(entry: dict) -> str:
    text = f"{entry['target']} ({'met' if entry['met'] else 'NOT met'})"
    if entry['missed']:
        text += f"; over: {', '.join(entry['missed'])}"
    return text


def target_lines(report: dict) -> dict:
    return dict(
        posmlp_vs_swin=inference_targets(report.get('results') or []),
        training=training_targets(report.get('training') or []),
        gpu_proxy=gpu_proxy_targets(
            (report.get('gpu_proxy') or {}).get('rows') or []))
