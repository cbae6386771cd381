"""What the gate ablation writes: JSON, a Markdown table, a plot, and the
section of docs/positional_encoding.md that sets it beside the paper.

Everything here reads the result dict of
:func:`.gate_ablation.run_ablation` (or the JSON it was saved as), so the
table, the plot and the docs are always made from the same numbers. The
result carries, besides each seed's top-1, each gate's 95% interval and a
paired test for each pair of gates (:func:`add_statistics`, from
:mod:`.seed_statistics`).
"""
from __future__ import annotations

import json
from itertools import combinations
from typing import List

from ..atomic_io import atomic_write_bytes
from .seed_statistics import LEVEL, mean_interval, paired_test

JSON_NAME = 'ablation.json'
TABLE_NAME = 'ablation.md'
PLOT_NAME = 'ablation.png'
LABELS = {'gqpe': 'PoSGU + GQPE', 'lrpe': 'PoSGU + LRPE', 'sgu': 'SGU (gMLP)'}
SHORT = {'gqpe': 'GQPE', 'lrpe': 'LRPE', 'sgu': 'SGU'}  # in differences
POSGU = ('gqpe', 'lrpe')

# The paper's gate ablation (PosMLP, ImageNet-1k top-1): gMLP's SGU against
# PoSGU, and how the token-mixing parameters of a window of N tokens grow.
PAPER = dict(sgu_top1=72.14, posgu_top1=74.02, sgu_params_m=19.4,
             posgu_params_m=18.2,
             growth=dict(sgu='O(N^2)', lrpe='O(N)', gqpe='O(1)'))

STATISTICS_NOTE = (
    'each gate: the mean of its seeds\' top-1 with its Student-t 95% '
    'interval; each pair of gates: a paired t-test over the seeds (seed s '
    'of one gate against seed s of the other: the same data order and '
    'recipe seed), the mean difference with its 95% interval and the '
    'two-sided p-value; a difference is larger than the noise when its '
    'interval excludes 0')

# What the report reads from a result; a file without them was not written
# by tools/ablate_gates.py.
_REQUIRED = ('gates', 'seeds', 'epochs', 'classes', 'num_val',
             'chance_top1', 'arch', 'recipe', 'total_seconds',
             'seconds_per_epoch_note', 'no_positional_term')
_REQUIRED_PER_GATE = ('top1', 'top1_mean', 'top1_std', 'params',
                      'token_mixing_params', 'seconds_per_epoch')


def _pair_order(gates) -> List[str]:
    """Gates in LABELS order (SGU last), so that every difference with SGU
    reads "PoSGU gate - SGU": positive is the paper's direction."""
    order = list(LABELS)
    return sorted(gates, key=lambda g: order.index(g) if g in order
                  else len(order))


def add_statistics(result: dict) -> dict:
    """Add each gate's ``top1_interval`` and the ``paired`` tests (every
    pair of gates, seed against seed) to ``result``, from the per-seed
    top-1; returns ``result``."""
    gates = result['gates']
    for row in gates.values():
        interval = mean_interval(row['top1'], LEVEL)
        row['top1_interval'] = {k: interval[k] for k in
                                ('level', 'low', 'high', 'half_width')}
    paired = []
    for a, b in combinations(_pair_order(gates), 2):
        test = paired_test(gates[a]['top1'], gates[b]['top1'], LEVEL)
        paired.append(dict(
            a=a, b=b, diff_mean=test['mean'], diff_std=test['std'],
            low=test['low'], high=test['high'],
            half_width=test['half_width'], t=test['t'], df=test['df'],
            p=test['p'], level=LEVEL,
            larger_than_noise=test['larger_than_noise']))
    result['paired'] = paired
    result['statistics_note'] = STATISTICS_NOTE
    return result


def write_json(result: dict, path: str) -> None:
    atomic_write_bytes((json.dumps(result, indent=1) + '\n').encode(), path)


def read_json(path: str) -> dict:
    """The result saved at ``path``. A file from before the intervals and
    paired tests were reported gets them computed from its per-seed top-1;
    a file lacking what the report needs is refused, naming what is
    missing."""
    with open(path, encoding='utf-8') as f:
        result = json.load(f)
    if not isinstance(result, dict) or 'gates' not in result:
        raise ValueError(f'{path} is not an ablation result (no "gates")')
    missing = [k for k in _REQUIRED if k not in result]
    for gate, row in result['gates'].items():
        missing += [f'gates.{gate}.{k}' for k in _REQUIRED_PER_GATE
                    if k not in row]
    if missing:
        raise ValueError(f'{path} lacks {", ".join(missing)}: not an '
                         f'ablation result of tools/ablate_gates.py')
    wrong = [g for g, row in result['gates'].items()
             if len(row['top1']) != len(result['seeds'])]
    if wrong:
        raise ValueError(f'{path}: gates.<gate>.top1 of {", ".join(wrong)} '
                         f'does not hold one top-1 per seed of '
                         f'{result["seeds"]}, so the seeds cannot be '
                         f'paired')
    if 'paired' not in result or any(
            'top1_interval' not in row for row in result['gates'].values()):
        add_statistics(result)  # an older file: intervals from its seeds
    return result


def _label(gate: str) -> str:
    return LABELS.get(gate, gate)


def _short(gate: str) -> str:
    return SHORT.get(gate, gate)


def _interval_text(interval: dict, sign: str = '') -> str:
    if interval['low'] is None:
        return 'none (one seed)'
    return (f'{interval["low"]:{sign}.2f} to {interval["high"]:{sign}.2f}')


def _p_text(p) -> str:
    if p is None:
        return 'none (one seed)'
    return '< 0.001' if p < 0.001 else f'{p:.3f}'


def _p_clause(p) -> str:
    """'= 0.123' or '< 0.001', to follow a 'p'."""
    text = _p_text(p)
    return text if text.startswith('<') else f'= {text}'


def _noise_text(pair: dict) -> str:
    if pair['larger_than_noise'] is None:
        return 'no estimate of the noise from one seed'
    if pair['larger_than_noise']:
        return 'larger than the noise (the interval excludes 0)'
    return 'within the noise (the interval includes 0)'


def markdown_table(result: dict) -> str:
    """One row per gate: top-1 mean +- std over seeds, its 95% interval,
    each seed's top-1, parameters, token-mixing parameters and seconds per
    epoch."""
    seeds = len(result['seeds'])
    lines = [
        f'| gate | top-1 % (mean ± std, {seeds} seeds) | '
        f'{LEVEL:.0%} interval of the mean | per seed | params | '
        f'token-mixing params | growth with window N | s / epoch |',
        '|---|---|---|---|---|---|---|---|']
    for gate, row in result['gates'].items():
        per_seed = ', '.join(f'{v:.2f}' for v in row['top1'])
        lines.append(
            f'| {_label(gate)} | {row["top1_mean"]:.2f} ± '
            f'{row["top1_std"]:.2f} | {_interval_text(row["top1_interval"])}'
            f' | {per_seed} | {row["params"]:,} | '
            f'{row["token_mixing_params"]:,} | '
            f'{PAPER["growth"].get(gate, "?")} | '
            f'{row["seconds_per_epoch"]:.1f} |')
    return '\n'.join(lines) + '\n'


def paired_table(result: dict) -> str:
    """One row per pair of gates: the mean top-1 difference seed against
    seed, its 95% interval, the paired t-test's p-value and the verdict."""
    lines = [
        f'| difference (seed against seed) | mean, points | {LEVEL:.0%} '
        f'interval | p (paired t-test) | larger than the noise? |',
        '|---|---|---|---|---|']
    for pair in result['paired']:
        verdict = {None: 'no estimate (one seed)', True: 'yes',
                   False: 'no'}[pair['larger_than_noise']]
        lines.append(
            f'| {_short(pair["a"])} − {_short(pair["b"])} | '
            f'{pair["diff_mean"]:+.2f} | {_interval_text(pair, "+")} | '
            f'{_p_text(pair["p"])} | {verdict} |')
    return '\n'.join(lines) + '\n'


def _setup(result: dict) -> str:
    arch = result['arch']
    recipe = result['recipe']
    return (f'{len(result["classes"])} classes ({", ".join(result["classes"])}'
            f'; chance {result["chance_top1"]:.1f}%), '
            + (f'{result["num_train"]} training and '
               if 'num_train' in result else '') +
            f'{result["num_val"]} validation images, '
            f'{recipe["img_size"]} x {recipe["img_size"]} inputs; PosMLP '
            f'embed_dims {arch["embed_dims"]}, depths {arch["depths"]}, '
            f'windows {arch["window_size"]}; {result["epochs"]} epochs, '
            f'batch {recipe["batch_size"]}, AdamW lr {recipe["lr"]}, '
            f'seeds {result["seeds"]}, the same recipe for every gate')


def _run_time(result: dict) -> str:
    minutes = f'{result["total_seconds"] / 60:.1f} min'
    threads = result.get('threads')  # not in older files, None on a GPU
    if threads:
        minutes += f' with {threads} CPU thread{"s" if threads > 1 else ""}'
    return minutes


def _differences(result: dict) -> List[str]:
    """One sentence per pair of gates: the difference, its interval, p and
    whether it is larger than the noise."""
    seeds = len(result['seeds'])
    return [f'{_short(pair["a"])} − {_short(pair["b"])}: '
            f'{pair["diff_mean"]:+.2f} points ({LEVEL:.0%} interval '
            f'{_interval_text(pair, "+")}, p {_p_clause(pair["p"])}, paired '
            f't-test over {seeds} seeds): {_noise_text(pair)}.'
            for pair in result['paired']]


def table_page(result: dict) -> str:
    """DIR/ablation.md: the tables, the verdicts and how they were made."""
    answer = _plain_answer(result)
    return (f'# Gate ablation\n\n{_setup(result)}.\n\n'
            f'{markdown_table(result)}\n{paired_table(result)}\n'
            + (f'{answer}\n\n' if answer else '') +
            f'{" ".join(_differences(result))}\n\n'
            f'Top-1 of each run\'s final weights on the validation split. '
            f'Statistics: {result["statistics_note"]}. '
            f'Seconds per epoch: {result["seconds_per_epoch_note"]}. '
            f'Token-mixing parameters: the gate units\' (SGU\'s LayerNorm '
            f'not counted). No-positional-term row: '
            f'{result["no_positional_term"]}. Whole run: '
            f'{_run_time(result)}.\n')


def plot(result: dict, path: str) -> None:
    """Top-1 (mean, error bar its 95% interval; each seed a dot) against
    token-mixing parameters."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for gate, row in result['gates'].items():
        x = row['token_mixing_params']
        half = row['top1_interval']['half_width'] or 0.0
        ax.errorbar([x], [row['top1_mean']], yerr=[half], fmt='o',
                    capsize=4, label=_label(gate))
        ax.scatter([x] * len(row['top1']), row['top1'], s=10, alpha=0.4,
                   color=ax.lines[-1].get_color())
    ax.axhline(result['chance_top1'], color='grey', linestyle=':',
               label='chance')
    ax.set_xscale('log')
    ax.set_xlabel('token-mixing parameters (log scale)')
    ax.set_ylabel('validation top-1 (%)')
    ax.set_title(f'gate ablation: {len(result["seeds"])} seeds, '
                 f'{result["epochs"]} epochs; bars: {LEVEL:.0%} interval',
                 fontsize=10)
    ax.legend(fontsize=8, loc='best')
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pair(result: dict, a: str, b: str) -> dict:
    for pair in result['paired']:
        if (pair['a'], pair['b']) == (a, b):
            return pair
    raise KeyError(f'no paired test of {a} against {b} in the result')


def _parameters(result: dict) -> List[str]:
    """Each PoSGU gate's parameters against SGU's."""
    gates = result['gates']
    if 'sgu' not in gates:
        return []
    sgu = gates['sgu']
    out = []
    for gate in (g for g in POSGU if g in gates):
        row = gates[gate]
        ratio = row['token_mixing_params'] / sgu['token_mixing_params']
        out.append(f'{_label(gate)} has {row["token_mixing_params"]:,} '
                   f'token-mixing parameters against SGU\'s '
                   f'{sgu["token_mixing_params"]:,} ({ratio:.2f}x), '
                   f'{row["params"]:,} parameters in all against '
                   f'{sgu["params"]:,}.')
    return out


def _plain_answer(result: dict) -> str:
    """Did PoSGU beat SGU here, and by more than the noise? Before the
    figures, one clause per PoSGU gate."""
    gates = result['gates']
    posgu = [g for g in POSGU if g in gates]
    question = ('Did the paper\'s direction (PoSGU above SGU) hold here? ')
    if 'sgu' not in gates or not posgu:
        return (question + 'This run did not train both SGU and a PoSGU '
                'gate, so it says nothing about it.')
    clauses = []
    for gate in posgu:
        pair = _pair(result, gate, 'sgu')
        diff, noisy = pair['diff_mean'], not pair['larger_than_noise']
        above = 'above' if diff > 0 else 'below'
        if pair['larger_than_noise'] is None:
            clauses.append(f'{_label(gate)}: undecided, it scored {above} '
                           f'SGU, but one seed gives no estimate of the '
                           f'noise.')
        elif noisy:
            clauses.append(f'{_label(gate)}: undecided, it scored {above} '
                           f'SGU in the mean ({diff:+.2f} points), but '
                           f'within the noise.')
        elif diff > 0:
            clauses.append(f'{_label(gate)}: yes, it scored above SGU by '
                           f'more than the noise ({diff:+.2f} points).')
        else:
            clauses.append(f'{_label(gate)}: no, it scored below SGU by '
                           f'more than the noise ({diff:+.2f} points).')
    return question + ' '.join(clauses)


def _saturation(result: dict) -> str:
    """Whether the data told the gates apart at all: every gate's mean
    top-1 above chance + 10 points and below 95%."""
    low = result['chance_top1'] + 10.0
    out = [g for g, row in result['gates'].items()
           if not low <= row['top1_mean'] <= 95.0]
    if not out:
        return (f'Every gate lies between chance + 10 points '
                f'({low:.0f}%) and 95%: none failed to learn the task and '
                f'none saturated it.')
    return (f'{", ".join(_label(g) for g in out)} outside chance + 10 '
            f'points ({low:.0f}%) to 95%: a gate that did not learn the task '
            f'or saturated it cannot be told apart from the others here.')


def _small_data_caveat(result: dict) -> str:
    windows = result['arch']['window_size']
    params = max(row['params'] for row in result['gates'].values())
    return (
        f'**How far this speaks for ImageNet.** Not far. This is '
        + (f'{result["num_train"]} training and '
           if 'num_train' in result else '') +
        f'{result["num_val"]} validation images of {len(result["classes"])} '
        f'synthetic classes and a model of {params / 1e6:.2f}M parameters '
        f'trained for {result["epochs"]} epochs (minutes on a CPU), against '
        f'1.28M images of 1000 classes and a 19M-parameter model trained '
        f'with a full ImageNet schedule. A short schedule rewards the gate '
        f'that optimizes fastest from its initialization, not necessarily '
        f'the one that ends best. The windows here are at most '
        f'{max(windows)} x {max(windows)} tokens (the paper\'s are 14 x '
        f'14): at such a small N, LRPE\'s tables of (2w-1)^2 offsets per '
        f'channel group are no smaller than SGU\'s N x N matrix, and only '
        f'GQPE shows the parameter saving; the O(N^2) / O(N) / O(1) gap '
        f'opens with the window. (Both PoSGU gates also keep a per-query '
        f'bias of N numbers per block, counted here, so GQPE\'s count is '
        f'O(1) per group plus N.) The task does reward exactly what the '
        f'gates differ in, relative position, so a clear gap here says '
        f'which gate learns a spatial relation from few examples in a short '
        f'run; it neither confirms nor refutes the ImageNet result.')


def doc_section(result: dict, json_path: str, plot_path: str) -> str:
    """The generated section of docs/positional_encoding.md."""
    paper = PAPER
    lines = [
        f'Made by `tools/ablate_gates.py --update-doc` from `{json_path}`: '
        f'{_setup(result)}; the whole run took {_run_time(result)}.',
        '',
        markdown_table(result),
        f'![top-1 against token-mixing parameters]({plot_path})',
        '',
        f'**The paper** (ImageNet-1k top-1): SGU '
        f'{paper["sgu_top1"]}% top-1 with {paper["sgu_params_m"]}M '
        f'parameters, PoSGU {paper["posgu_top1"]}% with '
        f'{paper["posgu_params_m"]}M; token-mixing parameters per window of '
        f'N tokens grow as {paper["growth"]["sgu"]} for SGU, '
        f'{paper["growth"]["lrpe"]} for LRPE and {paper["growth"]["gqpe"]} '
        f'for GQPE.',
        '',
        '**Here:** ' + _plain_answer(result),
        '',
        paired_table(result),
        ' '.join(_differences(result) + _parameters(result)
                 + [_saturation(result)]),
        '',
        f'How the intervals and tests are made: '
        f'{result["statistics_note"]}.',
        '',
        _small_data_caveat(result),
        '',
    ]
    return '\n'.join(lines)
