"""What the gate ablation writes: JSON, a Markdown table, a plot, and the
section of docs/positional_encoding.md that sets it beside the paper.

Everything here reads the result dict of
:func:`.gate_ablation.run_ablation` (or the JSON it was saved as), so the
table, the plot and the docs are always made from the same numbers.
"""
from __future__ import annotations

import json
import math
from typing import List

from ..atomic_io import atomic_write_bytes

JSON_NAME = 'ablation.json'
TABLE_NAME = 'ablation.md'
PLOT_NAME = 'ablation.png'
LABELS = {'gqpe': 'PoSGU + GQPE', 'lrpe': 'PoSGU + LRPE', 'sgu': 'SGU (gMLP)'}

# The paper's gate ablation (PosMLP, ImageNet-1k top-1): gMLP's SGU against
# PoSGU, and how the token-mixing parameters of a window of N tokens grow.
PAPER = dict(sgu_top1=72.14, posgu_top1=74.02, sgu_params_m=19.4,
             posgu_params_m=18.2,
             growth=dict(sgu='O(N^2)', lrpe='O(N)', gqpe='O(1)'))


def write_json(result: dict, path: str) -> None:
    atomic_write_bytes((json.dumps(result, indent=1) + '\n').encode(), path)


def read_json(path: str) -> dict:
    with open(path, encoding='utf-8') as f:
        result = json.load(f)
    if not isinstance(result, dict) or 'gates' not in result:
        raise ValueError(f'{path} is not an ablation result (no "gates")')
    return result


def _label(gate: str) -> str:
    return LABELS.get(gate, gate)


def markdown_table(result: dict) -> str:
    """One row per gate: top-1 mean +- std over seeds, each seed's top-1,
    parameters, token-mixing parameters and seconds per epoch."""
    seeds = len(result['seeds'])
    lines = [
        f'| gate | top-1 % (mean ± std, {seeds} seeds) | per seed | '
        f'params | token-mixing params | growth with window N | '
        f's / epoch |',
        '|---|---|---|---|---|---|---|']
    for gate, row in result['gates'].items():
        per_seed = ', '.join(f'{v:.2f}' for v in row['top1'])
        lines.append(
            f'| {_label(gate)} | {row["top1_mean"]:.2f} ± '
            f'{row["top1_std"]:.2f} | {per_seed} | {row["params"]:,} | '
            f'{row["token_mixing_params"]:,} | '
            f'{PAPER["growth"].get(gate, "?")} | '
            f'{row["seconds_per_epoch"]:.1f} |')
    return '\n'.join(lines) + '\n'


def _setup(result: dict) -> str:
    arch = result['arch']
    recipe = result['recipe']
    return (f'{len(result["classes"])} classes ({", ".join(result["classes"])}'
            f'; chance {result["chance_top1"]:.1f}%), '
            f'{result["num_val"]} validation images, '
            f'{recipe["img_size"]} x {recipe["img_size"]} inputs; PosMLP '
            f'embed_dims {arch["embed_dims"]}, depths {arch["depths"]}, '
            f'windows {arch["window_size"]}; {result["epochs"]} epochs, '
            f'batch {recipe["batch_size"]}, AdamW lr {recipe["lr"]}, '
            f'seeds {result["seeds"]}, the same recipe for every gate')


def table_page(result: dict) -> str:
    """DIR/ablation.md: the table and how it was made."""
    return (f'# Gate ablation\n\n{_setup(result)}.\n\n'
            f'{markdown_table(result)}\n'
            f'Top-1 of each run\'s final weights on the validation split. '
            f'Seconds per epoch: {result["seconds_per_epoch_note"]}. '
            f'Token-mixing parameters: the gate units\' (SGU\'s LayerNorm '
            f'not counted). No-positional-term row: '
            f'{result["no_positional_term"]}. Whole run: '
            f'{result["total_seconds"] / 60:.1f} min.\n')


def plot(result: dict, path: str) -> None:
    """Top-1 (mean, error bar one std) against token-mixing parameters."""
    import matplotlib
    matplotlib.use('Agg')
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    for gate, row in result['gates'].items():
        x = row['token_mixing_params']
        ax.errorbar([x], [row['top1_mean']], yerr=[row['top1_std']],
                    fmt='o', capsize=4, label=_label(gate))
        ax.scatter([x] * len(row['top1']), row['top1'], s=10, alpha=0.4,
                   color=ax.lines[-1].get_color())
    ax.axhline(result['chance_top1'], color='grey', linestyle=':',
               label='chance')
    ax.set_xscale('log')
    ax.set_xlabel('token-mixing parameters (log scale)')
    ax.set_ylabel('validation top-1 (%)')
    ax.set_title(f'gate ablation: {len(result["seeds"])} seeds, '
                 f'{result["epochs"]} epochs', fontsize=10)
    ax.legend(fontsize=8, loc='best')
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _direction(result: dict) -> List[str]:
    """Sentences: did PoSGU beat SGU here, by more than the seeds' spread?"""
    gates = result['gates']
    if 'sgu' not in gates or not {'gqpe', 'lrpe'} & set(gates):
        return ['This run did not train both SGU and a PoSGU gate, so it '
                'says nothing about the paper\'s direction.']
    sgu = gates['sgu']
    out = []
    for gate in ('gqpe', 'lrpe'):
        if gate not in gates:
            continue
        row = gates[gate]
        diff = row['top1_mean'] - sgu['top1_mean']
        # the standard error of the difference of the two means; a gap
        # under two of them is what seeds alone often give
        noise = math.sqrt(row['top1_std'] ** 2 / len(row['top1']) +
                          sgu['top1_std'] ** 2 / len(sgu['top1']))
        ratio = abs(diff) / noise if noise > 0 else \
            (0.0 if diff == 0 else math.inf)
        if ratio <= 2:
            verdict = (f'not resolved by these seeds ({ratio:.2f} standard '
                       f'errors; two would be needed)')
        elif diff > 0:
            verdict = (f'the paper\'s direction ({ratio:.2f} standard '
                       f'errors)')
        else:
            verdict = (f'against the paper\'s direction ({ratio:.2f} '
                       f'standard errors)')
        out.append(
            f'{_label(gate)} {row["top1_mean"]:.2f}% vs SGU '
            f'{sgu["top1_mean"]:.2f}%: {diff:+.2f} points, standard error '
            f'of the difference {noise:.2f}: {verdict}; '
            f'{row["token_mixing_params"]:,} token-mixing parameters '
            f'against SGU\'s {sgu["token_mixing_params"]:,} '
            f'({row["token_mixing_params"] / sgu["token_mixing_params"]:.2f}'
            f'x), {row["params"]:,} parameters in all against '
            f'{sgu["params"]:,}.')
    return out


def _plain_answer(result: dict) -> str:
    """Did PoSGU beat SGU here? One sentence, before the figures."""
    gates = result['gates']
    posgu = [g for g in ('gqpe', 'lrpe') if g in gates]
    if 'sgu' not in gates or not posgu:
        return ''
    diffs = {g: gates[g]['top1_mean'] - gates['sgu']['top1_mean']
             for g in posgu}
    names = ' and '.join(_label(g) for g in posgu)
    if all(d > 0 for d in diffs.values()):
        return (f'Did the paper\'s direction hold here? In the means, yes: '
                f'{names} scored above SGU (the figures below say whether '
                f'by more than the seeds\' noise).')
    if all(d < 0 for d in diffs.values()):
        return (f'Did the paper\'s direction hold here? No: SGU scored '
                f'above {names} in the means (the figures below say by how '
                f'many standard errors).')
    return ('Did the paper\'s direction hold here? Mixed: one PoSGU gate '
            'scored above SGU and one below.')


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
        f'{_setup(result)}; the whole run took '
        f'{result["total_seconds"] / 60:.1f} min.',
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
        '**Here:** ' + ' '.join([_plain_answer(result)] + _direction(result)
                                + [_saturation(result)]),
        '',
        _small_data_caveat(result),
        '',
    ]
    return '\n'.join(lines)
