"""tools/compare_models.py: backbones timed each in a process of its own."""
from __future__ import annotations

import json

import pytest

from conftest import load_tool


def test_two_backbones_in_their_own_processes(tmp_path, capsys):
    """Both models step in every round, in processes of their own (the
    coordinator's page faults are not theirs), and the paired ratio is the
    median of the round-by-round ratios."""
    import statistics
    tool = load_tool('compare_models')
    out = tmp_path / 'r.json'
    result = tool.main(['--models', 'posmlp_t,resnet50', '--mode',
                        'inference', '--shape', '1x3x64x64', '--rounds', '3',
                        '--warmup', '1', '--json', str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    a, b = (result['models'][n] for n in ('posmlp_t', 'resnet50'))
    for m in (a, b):
        assert len(m['times']) == 3 and all(t > 0 for t in m['times'])
        assert m['median_s'] == statistics.median(m['times'])
        assert m['page_faults'] is None or m['page_faults'] >= 0
    r = result['ratios']['resnet50']
    assert r['paired'] == pytest.approx(statistics.median(
        x / y for x, y in zip(a['times'], b['times'])))
    assert r['medians'] == pytest.approx(a['median_s'] / b['median_s'])
    printed = capsys.readouterr().out
    assert 'posmlp_t / resnet50' in printed and 'page faults' in printed


def test_a_model_that_fails_in_its_process_is_named(tmp_path):
    """A step that raises in a worker (here: an input with the wrong number
    of channels) stops the comparison with the model and the error."""
    tool = load_tool('compare_models')
    with pytest.raises(SystemExit, match=r'posmlp_t failed.*channel'):
        tool.main(['--models', 'posmlp_t,resnet50', '--mode', 'inference',
                   '--shape', '1x4x64x64', '--rounds', '1',
                   '--warmup', '0'])


def test_bad_arguments_are_refused():
    tool = load_tool('compare_models')
    for argv in (['--models', 'posmlp_t'], ['--models', 'posmlp_t,nope'],
                 ['--shape', '2x512x512'], ['--shape', '2x3x0x64'],
                 ['--rounds', '0']):
        with pytest.raises(SystemExit):
            tool.main(argv)
