"""benchmarks.cli_sizes: the size parser every tool's options share."""
import argparse

import pytest

from benchmarks.cli_sizes import input_shape, parse_dims

from conftest import load_tool


@pytest.mark.parametrize('text, layout, expected', [
    ('2x3x512x512', 'BxCxHxW', (2, 3, 512, 512)),
    (' 1X800x1333 ', 'BxHxW', (1, 800, 1333)),
    ('300x460', 'HxW', (300, 460)),
])
def test_sizes_are_read_in_the_layout_order(text, layout, expected):
    assert parse_dims(text, layout) == expected


@pytest.mark.parametrize('text, layout', [
    ('512x512', 'BxHxW'),       # a part missing
    ('2x512x512', 'HxW'),       # a part too many
    ('2x0x512', 'BxHxW'),       # zero
    ('2x-1x512', 'BxHxW'),      # negative
    ('2x5.5x512', 'BxHxW'),     # not an integer
    ('2x²x512', 'BxHxW'),       # a digit int() does not read
    ('300', 'HxW'),             # the square shorthand is opt-in
    ('', 'HxW'),
])
def test_bad_sizes_name_the_layout(text, layout):
    with pytest.raises(argparse.ArgumentTypeError, match=layout):
        parse_dims(text, layout)


def test_square_shorthand():
    assert parse_dims('224', 'HxW', square=True) == (224, 224)
    assert parse_dims('224x300', 'HxW', square=True) == (224, 300)
    with pytest.raises(argparse.ArgumentTypeError, match=r'S \(square\)'):
        parse_dims('0', 'HxW', square=True)
    # only a two-part layout has a square shorthand
    with pytest.raises(argparse.ArgumentTypeError):
        parse_dims('224', 'BxHxW', square=True)


def test_argparse_reports_a_bad_shape_as_a_usage_error(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument('--shape', type=input_shape)
    assert parser.parse_args(['--shape', '2x3x64x96']).shape == (2, 3, 64, 96)
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(['--shape', '2x3x64'])
    assert exit_info.value.code == 2
    assert 'BxCxHxW' in capsys.readouterr().err


@pytest.mark.parametrize('argv, message', [
    (['time', '--steps', 'train:2x512x512,train:2x0x512'],
     "'2x0x512': expected 3 positive sizes BxHxW"),
    (['compile', '--shape', '800x0'], "'800x0': expected 2 positive sizes"),
    (['compile', '--sizes', '224,axb'], "'axb': expected 2 positive sizes"),
    (['versions', '--base', 'HEAD', '--shape', '-64'],
     "'-64': expected 4 positive sizes BxCxHxW"),
])
def test_benchmark_exits_naming_the_bad_size(argv, message, capsys):
    bench = load_tool('benchmark')
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err
