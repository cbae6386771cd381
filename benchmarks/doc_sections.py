"""Sections of a Markdown page written from a benchmark's JSON, not by hand.

A generated section sits between two marker lines::

    <!-- generated: NAME ... -->
    ...
    <!-- end generated: NAME -->

``update_sections`` replaces what lies between them (the markers stay, the
opening one rewritten to name the JSON it came from); the rest of the page,
written by hand, is left as it is.
"""
from __future__ import annotations

import re
from typing import Dict


def begin_marker(name: str, source: str,
                 tool: str = 'tools/benchmark.py') -> str:
    return (f'<!-- generated: {name} by {tool} --update-doc '
            f'from {source}; not to be edited by hand -->')


def end_marker(name: str) -> str:
    return f'<!-- end generated: {name} -->'


def update_sections(text: str, sections: Dict[str, str], source: str,
                    tool: str = 'tools/benchmark.py') -> str:
    """``text`` with each named section's body replaced by ``sections[name]``.
    Raises ValueError naming a section whose two markers the page lacks
    (or has more than once)."""
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
                tool: str = 'tools/benchmark.py') -> None:
    """``update_sections`` on the page at ``path``, written atomically;
    ``tool``: the command the opening marker names as the section's
    writer."""
    from posmlp_dense.atomic_io import atomic_write_bytes
    with open(path, encoding='utf-8') as f:
        text = f.read()
    atomic_write_bytes(
        update_sections(text, sections, source, tool).encode(), path)
