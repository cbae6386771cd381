"""tools/compare_versions.py: an earlier commit's model against this
checkout's, in one process."""
from __future__ import annotations

import importlib.util
import json
import math
import os.path as osp
import sys

import pytest
import torch

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TINY = dict(embed_dims=(16, 32), depths=(1, 1), mlp_ratio=(4, 4),
            gamma=(4, 8), window_size=((5, 5), (4, 4)))


def _tool():
    spec = importlib.util.spec_from_file_location(
        'compare_versions', osp.join(ROOT, 'tools', 'compare_versions.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not osp.exists(osp.join(ROOT, '.git')),
                    reason='needs a git checkout (the base is a commit)')
@pytest.mark.parametrize('mode', ['train', 'inference'])
def test_head_against_this_checkout(tmp_path, mode):
    """HEAD's package, imported under another name, runs against this
    checkout's on the same weights: the outputs agree, every round is
    timed for both, and the paired ratio is a median of those rounds."""
    tool = _tool()
    out = tmp_path / 'result.json'
    try:
        result = tool.main(['--base', 'HEAD', '--arch', json.dumps(TINY),
                            '--shape', '1x3x45x77', '--rounds', '3',
                            '--warmup', '0', '--mode', mode,
                            '--json', str(out)])
    finally:
        for name in [n for n in sys.modules
                     if n.startswith(tool.BASE_PACKAGE)]:
            del sys.modules[name]
    assert result['max_relative_difference'] < 1e-4
    assert len(result['times']['current']) == len(result['times']['base']) \
        == 3
    ratios = [c / b for c, b in zip(result['times']['current'],
                                    result['times']['base'])]
    assert result['ratio_paired'] == pytest.approx(sorted(ratios)[1])
    assert math.isfinite(result['ratio_paired']) and \
        result['ratio_paired'] > 0
    assert json.loads(out.read_text())['mode'] == mode


def test_versions_that_compute_different_things_are_not_timed():
    tool = _tool()
    x = torch.ones(2, 3)

    def current():
        return (x,), None

    def base():
        return (x * 1.01,), None

    with pytest.raises(SystemExit, match='compute different things'):
        tool.check_agreement(current, base)
    assert tool.check_agreement(current, current) == 0.0


def test_unknown_revision_is_named():
    tool = _tool()
    with pytest.raises(SystemExit, match='no-such-revision'):
        tool.main(['--base', 'no-such-revision', '--arch', json.dumps(TINY),
                   '--shape', '1x3x45x77', '--rounds', '1'])


@pytest.mark.parametrize('shape', ['3x45x77', '1x3x0x77', '1x3x45xa'])
def test_bad_shape_is_refused_with_its_text(shape, capsys):
    tool = _tool()
    with pytest.raises(SystemExit):
        tool.parse_args(['--base', 'HEAD', '--shape', shape])
    assert repr(shape) in capsys.readouterr().err
