"""Warnings that third-party packages print when a tool starts, and that say
nothing about the user's run. The tools (tools/*.py) hide them at their
entry, so that their first screen shows the user's problem first.

mmengine resolves a config's ``mmdet::`` and ``mmseg::`` bases through
``mmengine.utils.is_installed``, which imports and then reloads
``pkg_resources``; the setuptools that mmcv's build needs (< 82) warns at
every such import that the API is deprecated: five copies before the first
line of ``tools/train.py configs/retinanet_posmlp_s_fpn.py``.

Only these exact messages are matched; every other warning shows as before.
Importing the package never touches the warnings filters: only a tool's
``__main__`` block calls ``hide_known_third_party_warnings``.
"""
from __future__ import annotations

import re
import warnings

#: (start of the message, category) of each hidden warning.
KNOWN_THIRD_PARTY_WARNINGS = (
    # setuptools, on mmengine's import of pkg_resources
    ('pkg_resources is deprecated as an API', UserWarning),
)


def hide_known_third_party_warnings() -> None:
    """Ignore the warnings of ``KNOWN_THIRD_PARTY_WARNINGS`` in this
    process (and in the workers it forks)."""
    for message, category in KNOWN_THIRD_PARTY_WARNINGS:
        warnings.filterwarnings('ignore', message=re.escape(message),
                                category=category)
