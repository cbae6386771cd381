"""tools/core_lines.py traces the package lines a model's compute runs
through, the backward included."""
from __future__ import annotations

import inspect

from posmlp_dense.block_function import LeanBlock

from conftest import TINY_ARCH, load_tool


def test_core_lines_trace_forward_and_backward():
    tool = load_tool('core_lines')
    lines = tool.traced_lines(TINY_ARCH, (1, 3, 64, 80))
    files = {name for name, _ in lines}
    assert {'block_pass.py', 'token_mixing.py', 'windows.py',
            'gates/gqpe.py', 'gates/lrpe.py', 'gates/sgu.py'} <= files
    # the lean Function's backward runs (train and eval-with-grad)
    source, first = inspect.getsourcelines(LeanBlock.backward)
    backward = set(range(first, first + len(source)))
    assert {n for name, n in lines if name == 'block_function.py'} & backward
    assert 100 < len(lines) < 1000
