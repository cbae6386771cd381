"""The generated sections of a Markdown page: the lines between

    <!-- generated: NAME ... -->
    <!-- end generated: NAME -->

are a tool's, written from its JSON; the rest of the page is by hand."""
from __future__ import annotations

import re
from typing import Dict


def begin_marker(name: str, source: str,
                 tool: str = 'tools/benchmark.py render') -> str:
    return (f'<!-- generated: {name} by {tool} --update-doc '
            f'from {source}; not to be edited by hand -->')


def end_marker(name: str) -> str:
    return f'<!-- end generated: {name} -->'


def update_sections(text: str, sections: Dict[str, str], source: str,
                    tool: str = 'tools/benchmark.py render') -> str:
    """``text`` with each named section's lines replaced; ValueError names
    a section whose markers the page lacks (or has twice)."""
    for name, body in sections.items():
        pattern = re.compile(
            r'^<!-- generated: ' + re.escape(name) + r'\b[^\n]*-->\n'
            r'.*?^' + re.escape(end_marker(name)) + r'$',
            re.MULTILINE | re.DOTALL)
        found = pattern.findall(text)
        if len(found) != 1:
            raise ValueError(
                f'the page has {len(found)} sections {name!r} (expected one '
                f'between a line starting "<!-- generated: {name}" and a line '
                f'"{end_marker(name)}"); add the two marker lines where the '
                f'section goes')
        block = (begin_marker(name, source, tool) + '\n'
                 + body.strip('\n') + '\n' + end_marker(name))
        text = pattern.sub(lambda _: block, text)
    return text


def update_file(path: str, sections: Dict[str, str], source: str,
                tool: str = 'tools/benchmark.py render') -> None:
    """``update_sections`` on the page at ``path``, written atomically."""
    from posmlp_dense.atomic_io import atomic_write_bytes
    with open(path, encoding='utf-8') as f:
        text = f.read()
    atomic_write_bytes(
        update_sections(text, sections, source, tool).encode(), path)
