"""Registry glue: PosMLP in the mmdet and mmseg model registries.

Imported by ``posmlp_dense/__init__.py`` when mmengine is installed. It
registers ``PosMLP`` with whichever of mmdet and mmseg are installed (configs
use ``type='PosMLP'``, or the scoped ``mmdet.PosMLP`` / ``mmseg.PosMLP``,
with ``custom_imports=dict(imports=['posmlp_dense'])``), lets safe loading
read mmengine's training checkpoints, and provides a DDP wrapper for CPU
runs.
"""
from __future__ import annotations

import importlib
import logging

from .runtime import atomic_checkpoints  # noqa: F401  (registers 'local_atomic')
from ..optional_deps import is_installed
from .backbone import MMPosMLP
from .runtime.cpu_ddp import CPUCompatibleDDP
from .runtime.safe_checkpoints import allow_mmengine_checkpoints

FRAMEWORKS = ('mmdet', 'mmseg')


class _RunnerLogHandler(logging.Handler):
    """Forwards the package's log records to mmengine's current logger."""

    def emit(self, record):
        from mmengine.logging import MMLogger, print_log
        if MMLogger._instance_dict:  # only inside a run; never create one
            print_log(self.format(record), logger='current',
                      level=record.levelno)


def installed_frameworks():
    return tuple(f for f in FRAMEWORKS if is_installed(f))


def register_all():
    """Register PosMLP in the installed frameworks' MODELS registries."""
    for framework in installed_frameworks():
        registry = importlib.import_module(f'{framework}.registry').MODELS
        if registry.get('PosMLP') is not MMPosMLP:
            registry.register_module('PosMLP', module=MMPosMLP, force=True)
    allow_mmengine_checkpoints()
    logger = logging.getLogger('posmlp_dense')
    if not any(isinstance(h, _RunnerLogHandler) for h in logger.handlers):
        logger.addHandler(_RunnerLogHandler())
        logger.setLevel(logging.INFO)


__all__ = ['MMPosMLP', 'CPUCompatibleDDP', 'register_all',
           'installed_frameworks']
