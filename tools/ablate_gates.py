#!/usr/bin/env python
r"""The paper's gate ablation in one command: the same small PosMLP trained
with each gate (GQPE, LRPE, SGU), several seeds, one recipe for all.

    python tools/ablate_gates.py --out work_dirs/ablation
    python tools/ablate_gates.py --data /path/to/imagefolder --gates gqpe,sgu \
        --seeds 5 --epochs 20 --out work_dirs/ablation_mine
    # the run shown in docs/positional_encoding.md
    python tools/ablate_gates.py --out docs/ablation \
        --update-doc docs/positional_encoding.md

Writes OUT/ablation.json (per gate: each seed's top-1, mean, std, the 95%
Student-t interval of the mean, total and token-mixing parameters, seconds
per epoch; per pair of gates: a paired t-test over the seeds, the mean
difference with its 95% interval and p-value), OUT/ablation.png (top-1 with
95% intervals against token-mixing parameters) and OUT/ablation.md (the
tables, and which differences are larger than the noise).
Without --data it trains on the built-in relation set (where a triangle
sits relative to a circle; posmlp_dense.data.relation_classes), made under
data/demo_rel first if it is not there. With --update-doc PAGE it rewrites
PAGE's generated section "gate-ablation" from the JSON.
"""
import argparse
import os
import sys

from benchmarks.doc_sections import update_file, update_sections
from posmlp_dense.analysis import ablation_report as report
from posmlp_dense.analysis.gate_ablation import (ABLATION_RECIPE,
                                                 DEFAULT_SEEDS,
                                                 AblationSettings,
                                                 run_ablation)
from posmlp_dense.archs import GATES
from posmlp_dense.data import relation_classes

SECTION = 'gate-ablation'


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Train the same small PosMLP with each gate and compare '
        'top-1, parameters and time (the paper\'s gate ablation, small).',
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split('\n\n', 1)[1])
    parser.add_argument('--data', default=None,
                        help='ImageFolder tree DATA/train/<class>/*, '
                        'DATA/val/<class>/* (default: the built-in relation '
                        'set, data/demo_rel, made if missing)')
    parser.add_argument('--gates', default=','.join(GATES),
                        help=f'comma-separated gates (default: '
                        f'{",".join(GATES)})')
    parser.add_argument('--seeds', type=int, default=DEFAULT_SEEDS,
                        help=f'seeds per gate (default: {DEFAULT_SEEDS})')
    parser.add_argument('--epochs', type=int,
                        default=ABLATION_RECIPE.epochs,
                        help=f'epochs per run (default: '
                        f'{ABLATION_RECIPE.epochs})')
    parser.add_argument('--out', required=True,
                        help='folder for ablation.json, .png and .md')
    parser.add_argument('--work-dir', default=None,
                        help='keep each run\'s log and checkpoints here '
                        '(default: a temporary folder, removed)')
    parser.add_argument('--device', default='cpu',
                        help='cpu (default) or cuda (then with the '
                        'recipe\'s fp16 autocast)')
    parser.add_argument('--update-doc', metavar='PAGE', default=None,
                        help=f'rewrite the "{SECTION}" section of PAGE '
                        f'(e.g. docs/positional_encoding.md) from the JSON')
    parser.add_argument('--from-json', action='store_true',
                        help='train nothing: redo the table, plot and '
                        '--update-doc from OUT/ablation.json (a file from '
                        'before the intervals gets them from its per-seed '
                        'top-1)')
    return parser.parse_args(argv)


def _doc(args, result, json_path, plot_path):
    page_dir = os.path.dirname(os.path.abspath(args.update_doc))
    section = report.doc_section(
        result, os.path.relpath(json_path),
        os.path.relpath(os.path.abspath(plot_path), page_dir))
    update_file(args.update_doc, {SECTION: section},
                os.path.relpath(json_path), tool='tools/ablate_gates.py')
    print(f'rewrote the section "{SECTION}" of {args.update_doc}')


def main(argv=None) -> int:
    args = parse_args(argv)
    gates = [g.strip() for g in args.gates.split(',') if g.strip()]
    json_path = os.path.join(args.out, report.JSON_NAME)
    plot_path = os.path.join(args.out, report.PLOT_NAME)
    try:
        if args.update_doc:  # before training: the page has the markers
            with open(args.update_doc, encoding='utf-8') as f:
                update_sections(f.read(), {SECTION: ''}, json_path)
        if args.from_json:
            result = report.read_json(json_path)
        else:
            data = args.data
            if data is None:
                made = relation_classes.make_relation_set(
                    relation_classes.default_root('data'))
                data = made['root']
            settings = AblationSettings(data=data, gates=gates,
                                        seeds=args.seeds, epochs=args.epochs,
                                        work_dir=args.work_dir,
                                        device=args.device)
            settings.check()
            os.makedirs(args.out, exist_ok=True)
            result = run_ablation(settings)
            report.write_json(result, json_path)
    except (OSError, ValueError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    with open(os.path.join(args.out, report.TABLE_NAME), 'w',
              encoding='utf-8') as f:
        f.write(report.table_page(result))
    report.plot(result, plot_path)
    print(report.markdown_table(result))
    print(f'wrote {json_path}, {os.path.join(args.out, report.TABLE_NAME)} '
          f'and {plot_path}')
    if args.update_doc:
        _doc(args, result, json_path, plot_path)
    return 0


if __name__ == '__main__':
    sys.exit(main())
