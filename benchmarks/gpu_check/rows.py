"""The check table: one row per check, with status ok, FAIL or skipped.

A check is a function that returns a ``Verdict`` or raises ``Skip``; any
other exception makes its row FAIL (the traceback goes to stderr) and the
run goes on with the next check.
"""
from __future__ import annotations

import dataclasses
import sys
import textwrap
import time
import traceback
from typing import Callable, Dict, List, Optional

STATUSES = ('ok', 'FAIL', 'skipped')


class Skip(Exception):
    """The check cannot run here; the message says why."""


@dataclasses.dataclass
class Verdict:
    passed: bool
    detail: str  # the figures, or what went wrong
    figures: Dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Row:
    section: str
    check: str
    status: str  # one of STATUSES
    detail: str  # figures; for FAIL and skipped rows the reason
    seconds: float
    figures: Dict = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def run_check(section: str, check: str, fn: Callable[[], Verdict],
              log: Callable[[str], None]) -> Row:
    start = time.perf_counter()
    try:
        verdict = fn()
    except Skip as skip:
        status, detail, figures = 'skipped', str(skip), {}
    except Exception as err:  # noqa: BLE001  (a failing check is a row)
        traceback.print_exc(file=sys.stderr)
        status, figures = 'FAIL', {}
        first = str(err).strip().splitlines()
        detail = f'{type(err).__name__}: {first[0] if first else ""}'
    else:
        status = 'ok' if verdict.passed else 'FAIL'
        detail, figures = verdict.detail, verdict.figures
    row = Row(section, check, status, detail, time.perf_counter() - start,
              figures)
    log(f'{section} | {check} | {status} | {detail}')
    return row


def skipped_row(section: str, check: str, reason: str) -> Row:
    return Row(section, check, 'skipped', reason, 0.0)


def table(rows: List[Row], width: int = 160) -> str:
    """The rows as a plain-text table, ``detail`` wrapped to fit."""
    heads = ('section', 'check', 'status', 's')
    cells = [(r.section, r.check, r.status, f'{r.seconds:.1f}') for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells])
              for i, h in enumerate(heads)]
    lead = sum(widths) + 2 * len(widths)
    lines = ['  '.join(h.ljust(w) for h, w in zip(heads, widths))
             + '  detail']
    for row, c in zip(rows, cells):
        wrapped = textwrap.wrap(row.detail, max(40, width - lead)) or ['']
        lines.append('  '.join(v.ljust(w) for v, w in zip(c, widths))
                     + '  ' + wrapped[0])
        lines += [' ' * lead + part for part in wrapped[1:]]
    return '\n'.join(lines)


def ms(seconds: Optional[float]) -> str:
    return '-' if seconds is None else f'{seconds * 1e3:.1f} ms'


def summary(rows: List[Row]) -> str:
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    verdict = 'FAIL' if counts['FAIL'] else 'PASS'
    return (f"RESULT: {verdict} ({counts['ok']} ok, {counts['FAIL']} failed, "
            f"{counts['skipped']} skipped)")
