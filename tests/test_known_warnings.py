"""The tools hide the known third-party warnings of their first screen
(posmlp_dense/known_warnings.py), and no other warning."""
from __future__ import annotations

import warnings

from posmlp_dense.known_warnings import (KNOWN_THIRD_PARTY_WARNINGS,
                                         hide_known_third_party_warnings)

SETUPTOOLS = ('pkg_resources is deprecated as an API. See https://'
              'setuptools.pypa.io/en/latest/pkg_resources.html.')


def _shown(*warnings_to_raise):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        hide_known_third_party_warnings()
        for message, category in warnings_to_raise:
            warnings.warn(message, category)
    return [(str(w.message), w.category) for w in caught]


def test_setuptools_deprecation_of_pkg_resources_is_known():
    assert any(SETUPTOOLS.startswith(m) and c is UserWarning
               for m, c in KNOWN_THIRD_PARTY_WARNINGS)


def test_only_the_known_warnings_are_hidden():
    others = [('the user config names no data root', UserWarning),
              # the same text, as another category, or not at the start
              (SETUPTOOLS, DeprecationWarning),
              ('note: ' + SETUPTOOLS, UserWarning)]
    assert _shown((SETUPTOOLS, UserWarning), *others) == others


def test_hiding_stays_inside_the_caller_that_asked():
    before = list(warnings.filters)
    _shown((SETUPTOOLS, UserWarning))
    assert warnings.filters == before
