"""tools/ablate_gates.py: the plumbing of the gate ablation on tiny data
(one epoch; the accuracy is not checked), its parameter counts and its
errors."""
from __future__ import annotations

import json
import os.path as osp

import pytest
import torch

from posmlp_dense.analysis.ablation_report import doc_section, read_json
from posmlp_dense.analysis.gate_ablation import (ABLATION_ARCH,
                                                 token_mixing_parameters)
from posmlp_dense.classifier import create_posmlp_classifier
from posmlp_dense.data.relation_classes import make_relation_set

from conftest import load_tool

TOOL = load_tool('ablate_gates')
SECTION, main = TOOL.SECTION, TOOL.main

SEEDS = 2


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('rel'))
    # one batch of 32 training images, as small as the recipe allows
    make_relation_set(root, num_train=32, num_val=8, image_size=32, seed=2)
    return root


@pytest.fixture(scope='module')
def ablation(data, tmp_path_factory):
    out = str(tmp_path_factory.mktemp('ablation'))
    assert main(['--data', data, '--seeds', str(SEEDS), '--epochs', '1',
                 '--out', out]) == 0
    with open(osp.join(out, 'ablation.json')) as f:
        return out, json.load(f)


def test_writes_json_png_and_table(ablation):
    out, result = ablation
    assert list(result['gates']) == ['gqpe', 'lrpe', 'sgu']
    for gate, row in result['gates'].items():
        assert set(row) >= {'top1', 'top1_mean', 'top1_std', 'params',
                            'token_mixing_params', 'seconds_per_epoch'}
        assert len(row['top1']) == SEEDS
        assert all(0 <= v <= 100 for v in row['top1'])
        assert row['top1_mean'] == pytest.approx(sum(row['top1']) / SEEDS)
        assert row['top1_std'] >= 0 and row['seconds_per_epoch'] > 0
    assert result['classes'] == ['above', 'below', 'left', 'right']
    assert result['chance_top1'] == 25.0 and result['epochs'] == 1
    assert result['num_train'] == 32 and result['num_val'] == 8
    assert result['threads'] == torch.get_num_threads()
    with open(osp.join(out, 'ablation.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    table = open(osp.join(out, 'ablation.md')).read()
    for label in ('GQPE', 'LRPE', 'SGU'):
        assert label in table
    assert f'{result["gates"]["sgu"]["params"]:,}' in table


def test_json_table_and_section_carry_intervals_and_paired_tests(ablation):
    out, result = ablation
    for row in result['gates'].values():
        interval = row['top1_interval']
        assert interval['level'] == 0.95
        assert interval['low'] <= row['top1_mean'] <= interval['high']
    assert [(p['a'], p['b']) for p in result['paired']] == [
        ('gqpe', 'lrpe'), ('gqpe', 'sgu'), ('lrpe', 'sgu')]
    for pair in result['paired']:
        diffs = [a - b for a, b in zip(result['gates'][pair['a']]['top1'],
                                       result['gates'][pair['b']]['top1'])]
        assert pair['diff_mean'] == pytest.approx(sum(diffs) / SEEDS)
        assert pair['df'] == SEEDS - 1
    table = open(osp.join(out, 'ablation.md')).read()
    assert 'p (paired t-test)' in table and '95% interval' in table
    section = doc_section(result, 'x.json', 'x.png')
    assert 'Did the paper\'s direction (PoSGU above SGU) hold here?' in \
        section
    assert 'the noise' in section


def test_from_json_reads_an_older_file_without_the_statistics(ablation,
                                                               tmp_path):
    _, result = ablation
    old = {k: v for k, v in result.items()
           if k not in ('paired', 'statistics_note', 'num_train')}
    old['gates'] = {g: {k: v for k, v in row.items() if k != 'top1_interval'}
                    for g, row in result['gates'].items()}
    out = tmp_path / 'old'
    out.mkdir()
    (out / 'ablation.json').write_text(json.dumps(old))
    assert main(['--out', str(out), '--from-json']) == 0
    table = (out / 'ablation.md').read_text()
    assert 'p (paired t-test)' in table
    assert f'{result["paired"][0]["diff_mean"]:+.2f}' in table


def test_from_json_names_what_a_file_lacks(ablation, tmp_path, capsys):
    _, result = ablation
    broken = dict(result)
    del broken['seeds']
    (tmp_path / 'ablation.json').write_text(json.dumps(broken))
    assert main(['--out', str(tmp_path), '--from-json']) == 2
    assert 'lacks seeds' in capsys.readouterr().err


def _count(model, names):
    return sum(p.numel() for n, p in model.named_parameters()
               if any(part in n for part in names))


@pytest.mark.parametrize('gate, owns', [
    ('gqpe', ['gate_unit.pos.']),
    ('lrpe', ['gate_unit.pos.']),
    ('sgu', ['gate_unit.proj_list.']),
])
def test_parameter_counts(ablation, gate, owns):
    _, result = ablation
    model = create_posmlp_classifier(ABLATION_ARCH, gate, num_classes=4)
    row = result['gates'][gate]
    assert row['params'] == sum(p.numel() for p in model.parameters())
    assert row['token_mixing_params'] == _count(model, owns)
    assert token_mixing_parameters(model) == row['token_mixing_params']


def test_token_mixing_counts_follow_the_formulas():
    """Per block, window N = wh * ww tokens: SGU an N x N matrix and N
    biases; LRPE a (2wh-1)(2ww-1) x groups table and N biases; GQPE 2 + 4
    numbers per group and N biases."""
    # blocks in the first level only
    arch = dict(embed_dims=[16, 32, 64, 128], depths=[2, 0, 0, 0],
                mlp_ratio=[4, 4, 4, 2], gamma=[4, 4, 4, 4],
                window_size=[3, 3, 3, 3])
    n, groups, blocks = 9, 4, 2
    count = {g: token_mixing_parameters(create_posmlp_classifier(
        arch, g, num_classes=2)) for g in ('gqpe', 'lrpe', 'sgu')}
    assert count['sgu'] == blocks * (n * n + n)
    assert count['lrpe'] == blocks * (5 * 5 * groups + n)
    assert count['gqpe'] == blocks * (6 * groups + n)


def test_update_doc_rewrites_only_its_section(ablation, tmp_path):
    out, result = ablation
    page = tmp_path / 'page.md'
    page.write_text(f'# Page\n\nkept\n\n<!-- generated: {SECTION} -->\n'
                    f'OLD BODY\n<!-- end generated: {SECTION} -->\n\ntail\n')
    assert main(['--out', out, '--from-json', '--update-doc',
                 str(page)]) == 0
    text = page.read_text()
    assert text.startswith('# Page\n\nkept\n') and text.endswith('tail\n')
    assert 'OLD BODY' not in text and 'tools/ablate_gates.py' in text
    assert doc_section(result, 'x.json', 'x.png').split('\n')[2] in text


@pytest.mark.parametrize('args, message', [
    (['--data', '/no/such/folder'], 'data folder not found'),
    (['--gates', 'gqpe,posgu'], "unknown gate"),
    (['--gates', 'sgu,sgu'], 'named twice'),
    (['--seeds', '0'], 'seeds must be at least 1'),
    (['--epochs', '0'], 'epochs must be at least 1'),
    (['--device', 'tpu'], "device must be 'cpu' or 'cuda"),
])
def test_bad_input_is_named(data, tmp_path, capsys, args, message):
    argv = ['--data', data, '--out', str(tmp_path / 'o')] + args
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_update_doc_without_markers_fails_before_training(data, tmp_path,
                                                          capsys):
    page = tmp_path / 'page.md'
    page.write_text('# no markers\n')
    assert main(['--data', data, '--out', str(tmp_path / 'o'),
                 '--update-doc', str(page)]) == 2
    assert SECTION in capsys.readouterr().err
    assert not (tmp_path / 'o').exists()


def test_the_docs_section_is_the_one_generated_from_its_json():
    """docs/positional_encoding.md's ablation section is written from the
    JSON it names (tools/ablate_gates.py --from-json --update-doc), not by
    hand."""
    root = osp.dirname(osp.dirname(osp.abspath(__file__)))
    result = read_json(osp.join(root, 'docs', 'ablation', 'ablation.json'))
    body = doc_section(result, 'docs/ablation/ablation.json',
                       'ablation/ablation.png').strip('\n')
    with open(osp.join(root, 'docs', 'positional_encoding.md')) as f:
        page = f.read()
    start = page.index(f'<!-- generated: {SECTION} ')
    start = page.index('\n', start) + 1
    end = page.index(f'<!-- end generated: {SECTION} -->')
    assert page[start:end].strip('\n') == body
    for row in result['gates'].values():
        assert row['top1'] and len(row['top1']) == len(result['seeds'])
