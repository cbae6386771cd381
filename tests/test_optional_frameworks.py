"""posmlp_dense imports and works with only one of mmdet/mmseg, or neither."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Makes the named top-level packages look uninstalled to this interpreter.
HIDE = '''
import importlib.abc, sys
HIDDEN = set(sys.argv[1].split(',')) - {''}
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in HIDDEN:
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)
sys.meta_path.insert(0, Hide())
'''

CHECK = HIDE + '''
import torch
import posmlp_dense
from posmlp_dense import PosMLP
arch = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1),
            mlp_ratio=(4, 4, 4, 2), gamma=(4, 8, 16, 32), window_size=7)
outs = PosMLP(arch).eval()(torch.randn(1, 3, 64, 64))
assert [o.shape[1] for o in outs] == [16, 32, 64, 128]
registered = []
for name in ('mmdet', 'mmseg'):
    try:
        registry = __import__(name + '.registry', fromlist=['MODELS']).MODELS
    except ImportError:
        continue
    if registry.get('PosMLP') is not None:
        registered.append(name)
print('REGISTERED=' + ','.join(registered))
'''


@pytest.mark.parametrize('hidden,expected', [
    ('mmseg', 'mmdet'),
    ('mmdet', 'mmseg'),
    ('mmdet,mmseg', ''),
    ('mmdet,mmseg,mmengine,mmcv', ''),
])
def test_import_with_frameworks_missing(hidden, expected):
    env = dict(os.environ, PYTHONPATH=ROOT)
    res = subprocess.run([sys.executable, '-c', CHECK, hidden], cwd=ROOT,
                         env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f'REGISTERED={expected}\n' in res.stdout
