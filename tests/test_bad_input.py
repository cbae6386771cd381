"""Bad input fails at once, at the boundary, with a message naming the problem.

Model inputs and constructor arguments, then checkpoint files: of another
architecture, truncated, corrupt, missing, and carrying pickled code (which
must be refused without running it).
"""
from __future__ import annotations

import os
import pickle
import random

import pytest
import torch

from posmlp_dense import CheckpointError, PosMLP, load_pretrained
from posmlp_dense.checkpoint import read_checkpoint, save_checkpoint

from conftest import TINY_ARCH, fixture_arch, fixture_path

OFFICIAL = fixture_path('tiny_gqpe_official.pth')


# ------------------------------------------------------------ model input
class _Reached(AssertionError):
    pass


@pytest.fixture(scope='module')
def guarded_model():
    """A model whose stem raises if anything gets past ``check_input``."""
    model = PosMLP(TINY_ARCH, check_finite=True).eval()

    def stem_must_not_run(x, **kwargs):
        raise _Reached('bad input got past check_input into the stem')
    model.patch_embed.forward = stem_must_not_run
    return model


BAD_INPUTS = [
    ('3-D', lambda: torch.randn(3, 64, 64), ValueError,
     r'expects a 4-D \(B, C, H, W\) batch, got shape \(3, 64, 64\)'),
    ('5-D', lambda: torch.randn(1, 1, 3, 64, 64), ValueError,
     r'expects a 4-D .* got shape \(1, 1, 3, 64, 64\)'),
    ('channels', lambda: torch.randn(2, 4, 64, 64), ValueError,
     r'expects 3 input channels, got 4'),
    ('grey', lambda: torch.randn(2, 1, 64, 64), ValueError,
     r'expects 3 input channels, got 1'),
    ('empty batch', lambda: torch.randn(0, 3, 64, 64), ValueError,
     r'empty input of shape \(0, 3, 64, 64\)'),
    ('empty height', lambda: torch.randn(1, 3, 0, 64), ValueError,
     r'empty input of shape \(1, 3, 0, 64\)'),
    ('uint8 image', lambda: torch.zeros(1, 3, 64, 64, dtype=torch.uint8),
     TypeError, r'floating-point image, got torch.uint8'),
    ('float64', lambda: torch.randn(1, 3, 64, 64, dtype=torch.float64),
     TypeError, r'input is torch.float64 but the model weights are '
                r'torch.float32'),
    ('nan', lambda: torch.randn(1, 3, 64, 64).index_put_(
        (torch.tensor([0]), torch.tensor([1]), torch.tensor([5]),
         torch.tensor([7])), torch.tensor(float('nan'))), ValueError,
     r'input has 1 non-finite \(NaN/Inf\) values'),
    ('inf', lambda: torch.full((1, 3, 64, 64), float('inf')), ValueError,
     r'input has 12288 non-finite'),
    ('not a tensor', lambda: [[0.0] * 64] * 64, TypeError,
     r'expects a torch.Tensor'),
]


@pytest.mark.parametrize('make,error,message',
                         [case[1:] for case in BAD_INPUTS],
                         ids=[case[0] for case in BAD_INPUTS])
def test_bad_model_input_is_refused_at_the_boundary(guarded_model, make,
                                                    error, message):
    x = make()
    for call in (guarded_model, guarded_model.forward_intermediates):
        with pytest.raises(error, match=message):
            call(x)


def test_non_finite_check_is_an_option():
    x = torch.full((1, 3, 32, 32), float('nan'))
    unchecked = PosMLP(TINY_ARCH).eval()  # off by default: no reduction
    with torch.no_grad():
        assert not torch.isfinite(unchecked(x)[0]).all()
    with pytest.raises(ValueError, match='non-finite'):
        PosMLP(TINY_ARCH, check_finite=True).eval()(x)


def test_good_input_still_passes(guarded_model):
    with pytest.raises(_Reached):  # check_input lets it through to the stem
        guarded_model(torch.randn(1, 3, 64, 64))
    with torch.autocast('cpu', dtype=torch.bfloat16):  # autocast casts
        with pytest.raises(_Reached):
            guarded_model(torch.randn(1, 3, 64, 64, dtype=torch.bfloat16))


# ------------------------------------------------------ model arguments
def _arch(**changes):
    return dict(TINY_ARCH, **changes)


BAD_ARGUMENTS = [
    ('unknown arch', dict(arch='huge'), KeyError,
     r"unknown PosMLP arch 'huge'; expected one of \['b', 's', 't'\]"),
    ('arch of wrong type', dict(arch=3), TypeError,
     r'arch must be a name or a dict'),
    ('unknown gate', dict(arch=TINY_ARCH, gate='attention'), ValueError,
     r"unknown gate 'attention'; expected one of \('gqpe', 'lrpe', 'sgu'\)"),
    ('arch missing a field',
     dict(arch={k: v for k, v in TINY_ARCH.items() if k != 'gamma'}),
     KeyError, r"missing field\(s\) \['gamma'\]"),
    ('arch with a misspelt field', dict(arch=_arch(depth=(1, 1, 1, 1))),
     KeyError, r"unknown field\(s\) \['depth'\]"),
    ('arch lengths disagree', dict(arch=_arch(depths=(1, 1, 2))),
     ValueError, r"embed_dims has 4 entries but 'depths' has 3"),
    ('arch windows disagree', dict(arch=_arch(window_size=(7, 7, 7))),
     ValueError, r"embed_dims has 4 entries but 'window_size' has 3"),
    ('widths not multiples', dict(arch=_arch(embed_dims=(16, 24, 48, 96))),
     ValueError, r'embed_dims\[1\]=24 must be a multiple of '
                 r'embed_dims\[0\]=16'),
    ('width not an int', dict(arch=_arch(embed_dims=(16.0, 32, 64, 128))),
     ValueError, r'embed_dims\[0\] must be a positive int, got 16.0'),
    ('negative depth', dict(arch=_arch(depths=(1, -1, 2, 1))), ValueError,
     r'depths\[1\] must be an int >= 0, got -1'),
    ('gamma does not divide', dict(arch=_arch(gamma=(5, 8, 16, 32))),
     ValueError, r'level 0: gamma=5 must divide the gate channels '
                 r'int\(mlp_ratio \* dim\) / 2 = 32'),
    ('gamma does not divide (lrpe)',
     dict(arch=_arch(gamma=(4, 8, 24, 32)), gate='lrpe'), ValueError,
     r'level 2: gamma=24 must divide the gate channels'),
    ('gamma zero', dict(arch=_arch(gamma=(0, 8, 16, 32))), ValueError,
     r'gamma\[0\] must be a positive int, got 0'),
    ('window 0', dict(arch=TINY_ARCH, window_size=0), ValueError,
     r'window_size\[0\]: window size must be positive, got 0'),
    ('window negative', dict(arch=TINY_ARCH, window_size=-3), ValueError,
     r'window size must be positive, got -3'),
    ('window pair with 0', dict(arch=TINY_ARCH, window_size=(0, 3)),
     ValueError, r'window size must be positive, got \(0, 3\)'),
    ('one level window 0', dict(arch=TINY_ARCH, window_size=[7, 7, 0, 7]),
     ValueError, r'window_size\[2\]: window size must be positive, got 0'),
    ('arch window negative', dict(arch=_arch(window_size=(14, 14, -1, 7))),
     ValueError, r'window_size\[2\]: window size must be positive'),
    ('window in pixels', dict(arch=TINY_ARCH, window_size=224), ValueError,
     r'window side 224 is larger than the maximum 64 tokens'),
    ('window float', dict(arch=TINY_ARCH, window_size=7.5), ValueError,
     r'window_size must be an int, a pair or a list'),
    ('out_indices too big', dict(arch=TINY_ARCH, out_indices=(0, 4)),
     ValueError, r'out_indices entries must be ints in \[0, 3\], '
                 r'got \(0, 4\)'),
    ('out_indices negative', dict(arch=TINY_ARCH, out_indices=(-1,)),
     ValueError, r'out_indices entries must be ints in \[0, 3\]'),
    ('out_indices empty', dict(arch=TINY_ARCH, out_indices=()), ValueError,
     r'out_indices is empty'),
    ('out_indices repeated', dict(arch=TINY_ARCH, out_indices=(1, 1)),
     ValueError, r'out_indices names a level more than once: \(1, 1\)'),
    ('frozen_stages too big', dict(arch=TINY_ARCH, frozen_stages=5),
     ValueError, r'frozen_stages must be an int in \[-1, 4\], got 5'),
    ('frozen_stages below -1', dict(arch=TINY_ARCH, frozen_stages=-2),
     ValueError, r'frozen_stages must be an int in \[-1, 4\], got -2'),
    ('in_channels 0', dict(arch=TINY_ARCH, in_channels=0), ValueError,
     r'in_channels must be a positive int, got 0'),
    ('drop_path_rate 1', dict(arch=TINY_ARCH, drop_path_rate=1.0),
     ValueError, r'drop_path_rate must be in \[0, 1\), got 1.0'),
]


@pytest.mark.parametrize('kwargs,error,message',
                         [case[1:] for case in BAD_ARGUMENTS],
                         ids=[case[0] for case in BAD_ARGUMENTS])
def test_bad_arguments_are_refused_before_building(monkeypatch, kwargs,
                                                   error, message):
    # the check must come before any module is built: a mis-sized layer
    # would otherwise fail later with a shape error
    import posmlp_dense.backbone as backbone

    def no_build(*args, **kw):
        raise _Reached('a level was built from invalid settings')
    monkeypatch.setattr(backbone, 'PosMLPLevel', no_build)
    monkeypatch.setattr(backbone, 'ConvStem', no_build)
    with pytest.raises(error, match=message):
        PosMLP(**kwargs)


def test_openmmlab_backbone_refuses_the_same_way():
    pytest.importorskip('mmdet')
    from mmdet.registry import MODELS
    import posmlp_dense  # noqa: F401  (registers PosMLP)
    with pytest.raises(ValueError, match=r'unknown gate'):
        MODELS.build(dict(type='mmdet.PosMLP', arch=TINY_ARCH,
                          gate='gmlp'))
    with pytest.raises(ValueError, match=r'out_indices entries'):
        MODELS.build(dict(type='mmdet.PosMLP', arch=TINY_ARCH,
                          out_indices=(4,)))


# ------------------------------------------------- checkpoint: wrong model
def _snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_untouched(model, before):
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), f'{key} changed'


OTHER_MODELS = [
    ('other gate (lrpe)', dict(gate='lrpe'),
     ['gate: checkpoint gqpe vs model lrpe',
      'checkpoint keys unknown to the model',
      'attention_centers']),
    ('other gate (sgu)', dict(gate='sgu'),
     ['gate: checkpoint gqpe vs model sgu', 'proj_list']),
    ('shallower', dict(arch=dict(depths=(1, 1, 1, 1))),
     ['depths: checkpoint (1, 1, 2, 1) vs model (1, 1, 1, 1)',
      "checkpoint keys unknown to the model, first: "
      "['levels.2.encoder.1."]),
    ('deeper', dict(arch=dict(depths=(2, 2, 4, 2))),
     ['depths: checkpoint (1, 1, 2, 1) vs model (2, 2, 4, 2)',
      'model keys missing from the checkpoint']),
    ('wider', dict(arch=dict(embed_dims=(64, 128, 256, 512))),
     ['embed_dims: checkpoint (32, 64, 128, 256) vs model '
      '(64, 128, 256, 512)',
      'shape mismatches, first: patch_embed.projs.0.weight: checkpoint '
      '(16, 3, 3, 3) vs model (32, 3, 3, 3)']),
    ('published arch t', dict(arch='t'),
     ['embed_dims: checkpoint (32, 64, 128, 256) vs model '
      '(96, 192, 384, 768)',
      'depths: checkpoint (1, 1, 2, 1) vs model (2, 2, 18, 2)']),
]


@pytest.mark.parametrize('changes,expected', [c[1:] for c in OTHER_MODELS],
                         ids=[c[0] for c in OTHER_MODELS])
def test_checkpoint_of_another_architecture_is_refused(changes, expected):
    arch = changes.get('arch', {})
    arch = arch if isinstance(arch, str) else dict(fixture_arch('gqpe'),
                                                   **arch)
    model = PosMLP(arch, gate=changes.get('gate', 'gqpe'))
    before = _snapshot(model)
    with pytest.raises(CheckpointError) as err:
        load_pretrained(model, OFFICIAL)
    text = str(err.value)
    assert text.startswith(f'checkpoint {OFFICIAL} does not match the model '
                           f'architecture:')
    for part in expected:
        assert part in text, text
    _assert_untouched(model, before)  # refused, not half-loaded


def test_non_strict_loading_forgives_keys_but_never_shapes():
    shallower = PosMLP(dict(fixture_arch('gqpe'), depths=(1, 1, 1, 1)))
    report = load_pretrained(shallower, OFFICIAL, strict=False)
    assert report.unexpected[0].startswith('levels.2.encoder.1.')
    wider = PosMLP(dict(fixture_arch('gqpe'), embed_dims=(64, 128, 256, 512)))
    before = _snapshot(wider)
    with pytest.raises(CheckpointError, match='shape mismatches'):
        load_pretrained(wider, OFFICIAL, strict=False)
    _assert_untouched(wider, before)


def test_matching_checkpoint_loads():
    """The control for the refusals above: the right model accepts it."""
    model = PosMLP(fixture_arch('gqpe'))
    report = load_pretrained(model, OFFICIAL)
    assert report.unexpected == [] and len(report.loaded) > 50


def test_reading_a_checkpoint_keeps_the_users_safe_globals():
    """read_checkpoint allows argparse.Namespace (the published 'args')
    for its call only; a type the user had allowed already stays allowed
    (torch's context removes on exit what it was given)."""
    import argparse
    serialization = torch.serialization
    before = list(serialization.get_safe_globals())
    try:
        serialization.clear_safe_globals()
        read_checkpoint(OFFICIAL)
        assert argparse.Namespace not in serialization.get_safe_globals()
        serialization.add_safe_globals([argparse.Namespace])
        assert 'state_dict' in read_checkpoint(OFFICIAL)
        assert argparse.Namespace in serialization.get_safe_globals()
    finally:
        serialization.clear_safe_globals()
        serialization.add_safe_globals(before)


# --------------------------------------------------- checkpoint: bad files
@pytest.fixture
def model():
    return PosMLP(fixture_arch('gqpe'))


def _cut(tmp_path, keep):
    data = open(OFFICIAL, 'rb').read()
    path = tmp_path / 'cut.pth'
    path.write_bytes(data[:keep(len(data))])
    return str(path)


@pytest.mark.parametrize('keep', [lambda n: n // 2, lambda n: 1024,
                                  lambda n: n - 100, lambda n: 1],
                         ids=['half', 'first KiB', 'all but 100 bytes',
                              'one byte'])
def test_truncated_checkpoint(tmp_path, model, keep):
    path = _cut(tmp_path, keep)
    before = _snapshot(model)
    for call in (lambda: read_checkpoint(path),
                 lambda: load_pretrained(model, path)):
        with pytest.raises(CheckpointError,
                           match=rf'cannot read checkpoint {path}: the file '
                                 rf'is truncated or corrupt \(\S'):
            call()
    _assert_untouched(model, before)


def test_empty_checkpoint_file(tmp_path, model):
    path = tmp_path / 'empty.pth'
    path.write_bytes(b'')
    with pytest.raises(CheckpointError,
                       match=r'the file is empty \(0 bytes\)'):
        load_pretrained(model, str(path))


@pytest.mark.parametrize('seed', range(12))
def test_random_bytes_checkpoint(tmp_path, model, seed):
    path = tmp_path / 'random.pth'
    path.write_bytes(random.Random(seed).randbytes(4096))
    with pytest.raises(CheckpointError,
                       match=r'the file is truncated or corrupt \(\S'):
        load_pretrained(model, str(path))


@pytest.mark.parametrize('content,message', [
    (b'<!DOCTYPE html>\n<html><body>404 Not Found</body></html>\n',
     r'is an HTML/XML page \(a failed download\?\), not a checkpoint'),
    (b'version https://git-lfs.github.com/spec/v1\noid sha256:0123\n'
     b'size 9850079\n', r'is a Git LFS pointer file, not the checkpoint'),
    (bytes(4096), r'truncated or corrupt \(Cannot use ``weights_only=True`` '
                  r'with files saved in the legacy .tar format.\)$'),
], ids=['html page', 'git lfs pointer', 'zeros'])
def test_impostor_files(tmp_path, model, content, message):
    path = tmp_path / 'weights.pth'
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=message):
        load_pretrained(model, str(path))


def test_truncated_safetensors(tmp_path, model):
    path = tmp_path / 'weights.safetensors'
    save_checkpoint(model.state_dict(), str(path))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError,
                       match=r'cannot read safetensors checkpoint .*: it is '
                             r'truncated or corrupt'):
        load_pretrained(model, str(path))


def test_missing_checkpoint_file(tmp_path, model):
    path = str(tmp_path / 'no_such.pth')
    with pytest.raises(FileNotFoundError,
                       match=rf'checkpoint not found: {path}$'):
        load_pretrained(model, path)
    with pytest.raises(IsADirectoryError, match=r'is a directory, not a '
                                                r'checkpoint file'):
        load_pretrained(model, str(tmp_path))


def test_openmmlab_init_cfg_reports_the_same_errors(tmp_path):
    pytest.importorskip('mmdet')
    from mmdet.registry import MODELS
    import posmlp_dense  # noqa: F401
    cut = _cut(tmp_path, lambda n: n // 2)
    for checkpoint, error, message in [
            (str(tmp_path / 'nope.pth'), FileNotFoundError, 'not found'),
            (cut, CheckpointError, 'truncated or corrupt')]:
        backbone = MODELS.build(dict(
            type='mmdet.PosMLP', arch=fixture_arch('gqpe'),
            init_cfg=dict(type='Pretrained', checkpoint=checkpoint)))
        with pytest.raises(error, match=message):
            backbone.init_weights()


# ------------------------------------------- checkpoint: pickled code
class _Payload:
    """Unpickling this runs ``func(*args)``: the classic pickle attack."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _payloads(marker):
    import builtins
    return {
        'os.system': _Payload(os.system, f'touch "{marker}"'),
        'builtins.exec': _Payload(
            builtins.exec, f'open({str(marker)!r}, "w").write("ran")'),
        'builtins.open': _Payload(builtins.open, str(marker), 'w'),
    }


def _getattr_chain_pickle() -> bytes:
    """``().__class__.__base__.__subclasses__()`` built with getattr only.

    mmengine's loader allows ``getattr`` (its checkpoints need it), so there
    the lookups run; the final call of a non-allowlisted function must not.
    """
    def text(s):
        data = s.encode()
        return b'X' + len(data).to_bytes(4, 'little') + data

    get = b'cbuiltins\ngetattr\n'
    obj = b')'  # ()
    for name in ('__class__', '__base__', '__subclasses__'):
        obj = get + obj + text(name) + b'\x86R'  # getattr(obj, name)
    return b'\x80\x02' + obj + b')R.'  # ...()


@pytest.mark.parametrize('kind', ['os.system', 'builtins.exec',
                                  'builtins.open'])
def test_checkpoint_with_pickled_code_is_refused_without_running_it(
        tmp_path, model, kind):
    marker = tmp_path / 'MARKER'
    payload = _payloads(marker)[kind]
    path = str(tmp_path / 'evil.pth')
    weights = {k: v for k, v in model.state_dict().items()}
    torch.save({'state_dict': weights, 'extra': payload}, path)
    before = _snapshot(model)
    for call in (lambda: read_checkpoint(path),
                 lambda: load_pretrained(model, path)):
        with pytest.raises(CheckpointError) as err:
            call()
        text = str(err.value)
        assert text.startswith(f'refused to load {path}: it contains pickled '
                               f'Python objects that safe loading '
                               f'(weights_only=True) does not allow, and they '
                               f'were not run.')
        assert 'GLOBAL' in text  # names the refused global
        assert not marker.exists(), 'the pickled code ran'
    _assert_untouched(model, before)


def test_the_payloads_are_live(tmp_path):
    """Control: unpickled without safe loading, each payload does run."""
    for kind in ('os.system', 'builtins.exec', 'builtins.open'):
        marker = tmp_path / f'MARKER_{kind}'
        payload = _payloads(marker)[kind]
        result = pickle.loads(pickle.dumps(payload))
        if hasattr(result, 'close'):
            result.close()
        assert marker.exists(), kind
    # the getattr chain reaches every class of the interpreter
    assert int in pickle.loads(_getattr_chain_pickle())


def test_getattr_chain_cannot_call_anything(tmp_path):
    path = tmp_path / 'chain.pth'
    path.write_bytes(_getattr_chain_pickle())
    # the package's reader does not allow getattr at all
    with pytest.raises(CheckpointError,
                       match=r'refused to load .* they were not run\. Detail: '
                             r'Unsupported global: GLOBAL getattr'):
        read_checkpoint(str(path))
    # mmengine's loader (the opt-in runtime) allows it: the lookups run, the
    # final call of a function that is not allowlisted does not
    pytest.importorskip('mmengine')
    from posmlp_dense.openmmlab.runtime import load_from_local_weights_only
    with pytest.raises(CheckpointError,
                       match=r'refused to load .* they were not run\. Detail: '
                             r'Trying to call reduce for unrecognized '
                             r'function'):
        load_from_local_weights_only(str(path))


def test_mmengine_loader_refuses_pickled_code(tmp_path):
    """Resume/load_from in an OpenMMLab run read files safely as well."""
    pytest.importorskip('mmengine')
    # the opt-in runtime registers mmengine's safe local loader
    import posmlp_dense.openmmlab.runtime  # noqa: F401
    from mmengine.runner.checkpoint import _load_checkpoint
    marker = tmp_path / 'MARKER'
    path = str(tmp_path / 'evil_run.pth')
    torch.save({'meta': {}, 'state_dict': {},
                'message_hub': _payloads(marker)['os.system']}, path)
    with pytest.raises(CheckpointError, match=r'refused to load .* they were '
                                              r'not run.*GLOBAL (posix|nt)'
                                              r'\.system'):
        _load_checkpoint(path, map_location='cpu')
    assert not marker.exists()


def test_resume_from_a_truncated_run_checkpoint_names_the_problem(tmp_path):
    """--resume / load_from go through mmengine's loader, which reads with
    the package's checked reader: a cut-off file is named as such."""
    pytest.importorskip('mmengine')
    # the opt-in runtime registers mmengine's safe local loader
    import posmlp_dense.openmmlab.runtime  # noqa: F401
    from mmengine.runner.checkpoint import _load_checkpoint
    path = tmp_path / 'epoch_3.pth'
    torch.save({'meta': {'epoch': 3}, 'state_dict': {'w': torch.ones(256)}},
               str(path))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(CheckpointError, match=rf'cannot read checkpoint '
                                              rf'{path}: the file is '
                                              rf'truncated or corrupt'):
        _load_checkpoint(str(path), map_location='cpu')
    with pytest.raises(FileNotFoundError, match='checkpoint not found'):
        _load_checkpoint(str(tmp_path / 'missing.pth'), map_location='cpu')
