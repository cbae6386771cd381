"""PosMLP in the mmdet and mmseg model registries.

``import posmlp_dense`` calls ``register_all`` when mmengine is installed: it
registers ``PosMLP`` with whichever of mmdet and mmseg are installed
(configs use ``type='PosMLP'``, or the scoped ``mmdet.PosMLP`` /
``mmseg.PosMLP``, with ``custom_imports=dict(imports=['posmlp_dense'])``), and
does nothing else. The training-runtime components (atomic checkpoints, safe
loading of mmengine checkpoints, CPU DDP, log forwarding) are opt-in:
``posmlp_dense.openmmlab.runtime``.
"""
from __future__ import annotations

import importlib

from ..optional_deps import is_installed
from .backbone import MMPosMLP

FRAMEWORKS = ('mmdet', 'mmseg')


def installed_frameworks():
    return tuple(f for f in FRAMEWORKS if is_installed(f))


def register_all():
    """Register PosMLP in the installed frameworks' MODELS registries."""
    for framework in installed_frameworks():
        registry = importlib.import_module(f'{framework}.registry').MODELS
        # module_dict, not get(): get() would import all of mmdet.models
        if registry.module_dict.get('PosMLP') is not MMPosMLP:
            registry.register_module('PosMLP', module=MMPosMLP, force=True)


__all__ = ['MMPosMLP', 'register_all', 'installed_frameworks']
