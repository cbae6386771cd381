"""posmlp_dense.analysis.ablation_report on hand-made results (no
training): each gate's 95% interval and the paired tests reach the JSON,
the tables and the docs section with their verdict in words, and an older
JSON without them is completed or refused by name."""
from __future__ import annotations

import copy
import json

import pytest

from posmlp_dense.analysis import ablation_report as report


def _result(top1: dict, with_statistics: bool = True) -> dict:
    """A result as run_ablation writes it, with these per-seed top-1."""
    seeds = len(next(iter(top1.values())))
    gates = {}
    for gate, values in top1.items():
        mean = sum(values) / len(values)
        std = (sum((v - mean) ** 2 for v in values) /
               max(1, len(values) - 1)) ** 0.5
        gates[gate] = dict(top1=list(values), top1_mean=mean, top1_std=std,
                           params=450000, token_mixing_params=1000,
                           seconds_per_epoch=10.0)
    result = dict(
        data='data/demo_rel', classes=['above', 'below', 'left', 'right'],
        num_val=400, chance_top1=25.0, seeds=list(range(seeds)), epochs=6,
        arch=dict(embed_dims=[32, 64, 128, 256], depths=[1, 1, 2, 1],
                  window_size=[8, 8, 4, 2]),
        recipe=dict(img_size=64, batch_size=32, lr=0.002),
        no_positional_term='not run', seconds_per_epoch_note='wall time',
        total_seconds=600.0, gates=gates)
    return report.add_statistics(result) if with_statistics else result


# GQPE one point above SGU at every seed (larger than the noise, paper's
# direction); LRPE five below at every seed give or take one (larger than
# the noise, against it); GQPE - LRPE then clearly positive.
CLEAR = {'gqpe': [61.0, 51.0, 71.0, 56.0], 'lrpe': [55.0, 44.0, 66.0, 50.0],
         'sgu': [60.0, 50.0, 70.0, 55.0]}
# the gaps swamped by the seeds
NOISY = {'gqpe': [70.0, 40.0, 55.0], 'lrpe': [50.0, 65.0, 45.0],
         'sgu': [60.0, 50.0, 52.0]}


def test_statistics_in_the_result():
    result = _result(CLEAR)
    sgu = result['gates']['sgu']['top1_interval']
    # mean 58.75, std 8.539, t_{0.975,3} = 3.1824, sqrt(4) = 2
    assert sgu['level'] == 0.95
    assert sgu['half_width'] == pytest.approx(3.1824463 * 8.5391256 / 2,
                                              rel=1e-6)
    assert sgu['low'] == pytest.approx(58.75 - sgu['half_width'])
    pairs = {(p['a'], p['b']): p for p in result['paired']}
    assert set(pairs) == {('gqpe', 'lrpe'), ('gqpe', 'sgu'), ('lrpe', 'sgu')}
    assert pairs['gqpe', 'sgu']['diff_mean'] == 1.0
    assert pairs['gqpe', 'sgu']['p'] == 0.0
    assert pairs['gqpe', 'sgu']['larger_than_noise'] is True
    assert pairs['lrpe', 'sgu']['diff_mean'] == pytest.approx(-5.0)
    assert pairs['lrpe', 'sgu']['larger_than_noise'] is True
    assert 0 < pairs['lrpe', 'sgu']['p'] < 0.05
    json.dumps(result, allow_nan=False)  # strict JSON: no inf, no NaN


def test_differences_with_sgu_read_posgu_minus_sgu_whatever_the_order():
    top1 = {g: CLEAR[g] for g in ('sgu', 'lrpe', 'gqpe')}
    pairs = [(p['a'], p['b']) for p in _result(top1)['paired']]
    assert pairs == [('gqpe', 'lrpe'), ('gqpe', 'sgu'), ('lrpe', 'sgu')]


def test_tables_show_intervals_and_tests():
    result = _result(CLEAR)
    table = report.markdown_table(result)
    assert '95% interval' in table
    sgu = result['gates']['sgu']['top1_interval']
    assert f'{sgu["low"]:.2f} to {sgu["high"]:.2f}' in table
    paired = report.paired_table(result)
    lrpe = [p for p in result['paired'] if p['a'] == 'lrpe'][0]
    assert (f'| LRPE − SGU | -5.00 | {lrpe["low"]:+.2f} to '
            f'{lrpe["high"]:+.2f} | {lrpe["p"]:.3f} | yes |') in paired
    assert '| GQPE − SGU | +1.00 |' in paired and '< 0.001' in paired
    page = report.table_page(result)
    assert table in page and paired in page


def test_section_answers_the_paper_question_with_the_noise():
    section = report.doc_section(_result(CLEAR), 'a.json', 'a.png')
    assert 'Did the paper\'s direction (PoSGU above SGU) hold here?' in \
        section
    assert ('PoSGU + GQPE: yes, it scored above SGU by more than the noise'
            in section)
    assert ('PoSGU + LRPE: no, it scored below SGU by more than the noise'
            in section)
    assert 'larger than the noise (the interval excludes 0)' in section
    assert 'paired t-test over 4 seeds' in section
    assert 'standard error' not in section  # the old wording is gone
    assert report.paired_table(_result(CLEAR)) in section


def test_section_says_when_the_noise_wins():
    result = _result(NOISY)
    section = report.doc_section(result, 'a.json', 'a.png')
    assert 'PoSGU + GQPE: undecided, it scored above SGU in the mean' in \
        section
    assert 'PoSGU + LRPE: undecided, it scored below SGU in the mean' in \
        section
    assert 'within the noise (the interval includes 0)' in section
    assert 'larger than the noise (the interval' not in section
    assert all(p['larger_than_noise'] is False for p in result['paired'])


def test_one_seed_gives_no_verdict():
    result = _result({'gqpe': [60.0], 'sgu': [50.0]})
    section = report.doc_section(result, 'a.json', 'a.png')
    assert 'one seed gives no estimate of the noise' in section
    assert 'none (one seed)' in report.markdown_table(result)


def test_without_sgu_the_question_is_not_answered():
    section = report.doc_section(_result({'gqpe': [60.0, 61.0],
                                          'lrpe': [50.0, 52.0]}),
                                 'a.json', 'a.png')
    assert 'says nothing about it' in section


def test_older_json_gets_its_statistics_from_its_seeds(tmp_path):
    old = _result(CLEAR, with_statistics=False)
    path = tmp_path / 'ablation.json'
    path.write_text(json.dumps(old))
    read = report.read_json(str(path))
    assert read['paired'] == _result(CLEAR)['paired']
    assert read['gates']['gqpe']['top1_interval'] == \
        _result(CLEAR)['gates']['gqpe']['top1_interval']


def test_json_round_trip_keeps_the_statistics(tmp_path):
    result = _result(NOISY)
    path = str(tmp_path / 'ablation.json')
    report.write_json(result, path)
    assert report.read_json(path) == result


@pytest.mark.parametrize('drop, named', [
    (('seeds',), 'seeds'),
    (('gates', 'sgu', 'top1'), 'gates.sgu.top1'),
    (('gates', 'lrpe', 'params'), 'gates.lrpe.params'),
])
def test_json_lacking_what_the_report_needs_is_named(tmp_path, drop, named):
    result = copy.deepcopy(_result(CLEAR, with_statistics=False))
    parent = result
    for key in drop[:-1]:
        parent = parent[key]
    del parent[drop[-1]]
    path = tmp_path / 'ablation.json'
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match=f'lacks .*{named}'):
        report.read_json(str(path))


def test_json_with_unpaired_seeds_is_refused(tmp_path):
    result = _result(CLEAR, with_statistics=False)
    result['gates']['sgu']['top1'] = result['gates']['sgu']['top1'][:3]
    path = tmp_path / 'ablation.json'
    path.write_text(json.dumps(result))
    with pytest.raises(ValueError, match='cannot be paired'):
        report.read_json(str(path))


def test_the_run_time_names_the_threads_when_known():
    result = _result(CLEAR)
    assert 'the whole run took 10.0 min.' in report.doc_section(
        result, 'a.json', 'a.png')  # an older file: no thread count
    result['threads'] = 1
    assert 'the whole run took 10.0 min with 1 CPU thread.' in \
        report.doc_section(result, 'a.json', 'a.png')
    result['threads'] = 2
    assert 'Whole run: 10.0 min with 2 CPU threads.' in \
        report.table_page(result)


def test_p_values_read_as_sentences():
    sentences = ' '.join(report._differences(_result(CLEAR)))
    assert 'p < 0.001' in sentences and 'p = < ' not in sentences
    assert 'p = 0.' in ' '.join(report._differences(_result(NOISY)))
