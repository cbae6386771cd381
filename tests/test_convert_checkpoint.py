"""tools/convert_checkpoint.py: released checkpoint -> backbone checkpoint."""
from __future__ import annotations


import pytest
import torch

from posmlp_dense import PosMLP, load_pretrained
from posmlp_dense.checkpoint import read_checkpoint

from conftest import fixture_arch, fixture_path, load_tool



def _tool():
    return load_tool('convert_checkpoint')


@pytest.mark.parametrize('suffix', ['.pth', '.safetensors'])
@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_converted_backbone_computes_what_the_release_computes(
        gate, suffix, tmp_path):
    src = fixture_path(f'tiny_{gate}_official.pth')
    dst = str(tmp_path / f'backbone{suffix}')
    assert _tool().main([src, dst]) == 0
    keys = set(read_checkpoint(dst).get('state_dict', read_checkpoint(dst)))
    assert not any(k.startswith(('head.', 'norm.')) for k in keys)
    assert not any(k.endswith(('rel_indices', 'relative_position_index'))
                   for k in keys)
    direct = PosMLP(fixture_arch(gate), gate=gate, out_norm=False).eval()
    load_pretrained(direct, src)
    converted = PosMLP(fixture_arch(gate), gate=gate, out_norm=False).eval()
    report = load_pretrained(converted, dst)
    assert report.missing == [] and report.unexpected == []
    x = torch.randn(1, 3, 160, 96)
    with torch.no_grad():
        for a, b in zip(direct(x), converted(x)):
            assert torch.equal(a, b)


def test_conversion_for_other_windows(tmp_path):
    src = fixture_path('tiny_lrpe_official.pth')
    dst = str(tmp_path / 'w7.pth')
    assert _tool().main([src, dst, '--window-size', '7']) == 0
    state = read_checkpoint(dst)['state_dict']
    table = state['levels.0.encoder.0.gate_unit.pos.'
                  'window_relative_position_bias_table']
    assert table.shape == (13 * 13, 8)
    model = PosMLP(fixture_arch('lrpe'), gate='lrpe', window_size=7,
                   out_norm=False).eval()
    report = load_pretrained(model, dst)
    assert report.resized == []  # already made for 7x7 windows
    reference = PosMLP(fixture_arch('lrpe'), gate='lrpe', window_size=7,
                       out_norm=False).eval()
    load_pretrained(reference, src)  # resized while loading instead
    for key, value in reference.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key


def test_conversion_never_overwrites(tmp_path, capsys):
    tool = _tool()
    src = fixture_path('tiny_gqpe_official.pth')
    dst = tmp_path / 'out.pth'
    dst.write_bytes(b'precious')
    assert tool.main([src, str(dst)]) == 2
    assert 'exists' in capsys.readouterr().err
    assert dst.read_bytes() == b'precious'
    assert tool.main([src, src]) == 2
    assert tool.main([str(tmp_path / 'missing.pth'), str(tmp_path / 'x.pth')
                      ]) == 2
    assert 'not found' in capsys.readouterr().err
    assert tool.main([src, str(dst), '--overwrite']) == 0
    assert 'state_dict' in read_checkpoint(str(dst))
