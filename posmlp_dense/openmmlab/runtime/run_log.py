"""The package's log records in the run's log.

PosMLP logs a few things worth keeping with a run (e.g. a positional table
resized to the configured window when weights are loaded) to the standard
``logging`` logger ``posmlp_dense``. Importing ``posmlp_dense`` leaves that
logger as Python creates it (no handler, level NOTSET); importing
``posmlp_dense.openmmlab.runtime`` forwards its INFO and higher records to
mmengine's current logger, i.e. into the run's console and log file.
"""
from __future__ import annotations

import logging

from mmengine.logging import MMLogger, print_log

PACKAGE_LOGGER = 'posmlp_dense'


class RunLogHandler(logging.Handler):
    """Hands each record to mmengine's current logger, inside a run only."""

    def emit(self, record):
        if MMLogger._instance_dict:  # a run (an MMLogger) exists; make none
            print_log(self.format(record), logger='current',
                      level=record.levelno)


def forward_to_run_log():
    logger = logging.getLogger(PACKAGE_LOGGER)
    if not any(isinstance(h, RunLogHandler) for h in logger.handlers):
        logger.addHandler(RunLogHandler())
    if logger.level == logging.NOTSET:  # a level the user set stays
        logger.setLevel(logging.INFO)


forward_to_run_log()

__all__ = ['RunLogHandler', 'forward_to_run_log', 'PACKAGE_LOGGER']
