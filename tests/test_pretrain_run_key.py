"""posmlp_dense.pretraining.run_key: when the demo reuses a pretraining
checkpoint (no training here: the keys and files are what is tested)."""
from __future__ import annotations

import json
import os
import os.path as osp

import pytest

from posmlp_dense.data.shape_classes import make_classification_set
from posmlp_dense.pretraining import run_key
from posmlp_dense.pretraining.recipe import SHAPES_DEMO

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DET = osp.join(ROOT, 'configs/demo/retinanet_posmlp_t_fpn_demo-shapes.py')


@pytest.fixture
def data(tmp_path):
    root = str(tmp_path / 'cls')
    make_classification_set(root, num_train=6, num_val=3, image_size=32)
    return root


def _argv(data, output, *more):
    return ['--data', data, '--recipe', 'shapes-demo', '--arch-from-config',
            DET, '--output', output] + list(more)


def _finished_run(output, key):
    """What a finished run leaves: its checkpoint and, after it, the key."""
    os.makedirs(output, exist_ok=True)
    with open(run_key.checkpoint_path(output), 'wb') as f:
        f.write(b'weights')
    run_key.record(output, key)


def test_the_same_run_is_reused(data, tmp_path):
    out = str(tmp_path / 'run')
    key = run_key.run_key(_argv(data, out))
    # the shapes-demo recipe, resolved
    assert key['recipe'] == json.loads(json.dumps(SHAPES_DEMO.as_dict()))
    assert key['arch']['arch']['embed_dims'] == [32, 64, 128, 256]
    assert run_key.reuse_check(out, key)[0] is False  # nothing there yet
    _finished_run(out, key)
    assert run_key.reuse_check(out, run_key.run_key(_argv(data, out))) == (
        True, f'{run_key.checkpoint_path(out)} was made by this same run')


def test_another_command_is_not_reused_and_named(data, tmp_path):
    out = str(tmp_path / 'run')
    _finished_run(out, run_key.run_key(_argv(data, out)))
    longer = run_key.run_key(_argv(data, out, '--epochs', '80'))
    reusable, why = run_key.reuse_check(out, longer)
    assert not reusable
    assert 'command, recipe differ' in why


def test_changed_data_is_not_reused(data, tmp_path):
    out = str(tmp_path / 'run')
    _finished_run(out, run_key.run_key(_argv(data, out)))
    # the same folder, regenerated from another seed
    make_classification_set(data, num_train=6, num_val=3, image_size=32,
                            seed=1)
    reusable, why = run_key.reuse_check(out, run_key.run_key(_argv(data,
                                                                  out)))
    assert not reusable and 'data differ' in why


def test_a_changed_recipe_in_code_is_not_reused(data, tmp_path):
    out = str(tmp_path / 'run')
    key = run_key.run_key(_argv(data, out))
    stale = json.loads(json.dumps(key))
    stale['recipe']['lr'] = 1e-2  # what an older version of the code used
    _finished_run(out, stale)
    reusable, why = run_key.reuse_check(out, key)
    assert not reusable and 'recipe differ' in why


def test_an_unrecorded_or_interrupted_run_is_not_reused(data, tmp_path):
    out = str(tmp_path / 'run')
    key = run_key.run_key(_argv(data, out))
    _finished_run(out, key)
    run_key.forget(out)  # a new run started here and did not finish
    reusable, why = run_key.reuse_check(out, key)
    assert not reusable and 'no readable run_key.json' in why


def test_data_without_a_manifest_is_named(tmp_path):
    with pytest.raises(ValueError, match='manifest'):
        run_key.run_key(_argv(str(tmp_path), str(tmp_path / 'run')))
