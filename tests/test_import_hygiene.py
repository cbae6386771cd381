"""``import posmlp_dense`` registers the model and changes nothing else.

A fresh interpreter imports mmdet, mmseg and timm as a user's process would
have them, records the state other libraries own, imports ``posmlp_dense``
and compares: no module global of any library replaced, mmengine's
checkpoint loaders, file backends, hooks and model wrappers as they were, no
logging configured, torch's safe-loading allowlist as it was; PosMLP
registered in both frameworks. Importing ``posmlp_dense.openmmlab.runtime``
(the opt-in training runtime) registers exactly its components, still
without replacing anything. Neither loads the benchmark (``benchmarks``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Prints one JSON object: what changed between the two snapshots.
PROBE = r'''
import json
import logging
import sys
import types
import warnings

import mmdet
import mmdet.registry
import mmseg
import mmseg.registry
import timm
import torch
from mmengine.fileio.backends import registry_utils
from mmengine.hooks import checkpoint_hook
from mmengine.registry import HOOKS, MODEL_WRAPPERS
from mmengine.runner.checkpoint import CheckpointLoader

# Names Python itself adds to a module when it is used or when one of its
# submodules is imported for the first time: not a change by the package.
LAZY = {'__warningregistry__'}


def module_globals():
    """Every global of every module loaded so far (but this script)."""
    return {name: dict(vars(module))
            for name, module in list(sys.modules.items())
            if isinstance(module, types.ModuleType)
            and module is not sys.modules['__main__']}


def loggers():
    table = {'<root>': logging.getLogger()}
    table.update((name, logger) for name, logger in
                 logging.Logger.manager.loggerDict.items()
                 if isinstance(logger, logging.Logger))
    return {name: (logger.level, list(logger.handlers), logger.propagate,
                   logger.disabled) for name, logger in table.items()}


def snapshot():
    return dict(
        globals=module_globals(),
        schemes=dict(CheckpointLoader._schemes),
        backends=dict(registry_utils.backends),
        backend_prefixes=dict(registry_utils.prefix_to_backends),
        hooks=dict(HOOKS.module_dict),
        model_wrappers=dict(MODEL_WRAPPERS.module_dict),
        loggers=loggers(),
        safe_globals=list(torch.serialization.get_safe_globals()))


def replaced_globals(before, after):
    """'module.name' for each global that was rebound, deleted or added
    (other than a submodule appearing as an attribute of its package)."""
    changes = []
    for mod, old in before['globals'].items():
        new = after['globals'].get(mod, {})
        for name in set(old) | set(new):
            if name in LAZY:
                continue
            if name not in new:
                changes.append(f'{mod}.{name} (deleted)')
            elif name not in old:
                if not (isinstance(new[name], types.ModuleType)
                        and new[name].__name__ == f'{mod}.{name}'):
                    changes.append(f'{mod}.{name} (added)')
            elif new[name] is not old[name]:
                changes.append(f'{mod}.{name} (replaced)')
    return sorted(changes)


def changed_entries(old, new):
    return sorted(str(k) for k in set(old) | set(new)
                  if k not in old or k not in new or old[k] is not new[k])


def compare(before, after):
    old_loggers = before['loggers']
    new_loggers = after['loggers']
    return dict(
        globals=replaced_globals(before, after),
        schemes=changed_entries(before['schemes'], after['schemes']),
        backends=changed_entries(before['backends'], after['backends'])
        + changed_entries(before['backend_prefixes'],
                          after['backend_prefixes']),
        hooks=changed_entries(before['hooks'], after['hooks']),
        model_wrappers=changed_entries(before['model_wrappers'],
                                       after['model_wrappers']),
        # loggers that existed before: level, handlers, propagate, disabled
        loggers=sorted(name for name in old_loggers
                       if new_loggers.get(name) != old_loggers[name]),
        # loggers the import created: as logging.getLogger makes them
        new_loggers_configured=sorted(
            name for name in set(new_loggers) - set(old_loggers)
            if new_loggers[name][:2] != (logging.NOTSET, [])),
        safe_globals=changed_entries(
            dict.fromkeys(map(repr, before['safe_globals'])),
            dict.fromkeys(map(repr, after['safe_globals']))))


def summary(after_import):
    package = logging.getLogger('posmlp_dense')
    return dict(
        package_logger=[logging.getLevelName(package.level),
                        [type(h).__name__ for h in package.handlers]],
        mmdet=repr(mmdet.registry.MODELS.module_dict.get('PosMLP')),
        mmseg=repr(mmseg.registry.MODELS.module_dict.get('PosMLP')),
        timm=timm.is_model('posmlp_t'),
        # the benchmark is a package of its own that the model never loads
        benchmark_modules=sorted(m for m in sys.modules if m == 'benchmarks'
                                 or m.startswith('benchmarks.')),
        # the tools hide setuptools' warning; importing hides nothing
        pkg_resources_warning_hidden=any(
            f[1] is not None and 'pkg_resources' in f[1].pattern
            for f in warnings.filters))


first = snapshot()
import posmlp_dense  # noqa: E402
second = snapshot()
report = dict(package=compare(first, second), after_package=summary(second))
if sys.argv[1:] == ['runtime']:
    import posmlp_dense.openmmlab.runtime  # noqa: E402
    third = snapshot()
    report.update(runtime=compare(second, third), after_runtime=summary(third))
print('REPORT=' + json.dumps(report))
'''


def _probe(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep
               + os.environ.get('PYTHONPATH', ''))
    res = subprocess.run([sys.executable, '-c', PROBE, *args], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    line = [x for x in res.stdout.splitlines() if x.startswith('REPORT=')]
    return json.loads(line[-1][len('REPORT='):])


@pytest.fixture(scope='module')
def runtime_report():
    return _probe('runtime')


def test_import_registers_the_model_and_changes_nothing_else():
    report = _probe()
    changes = report['package']
    # nothing another library owns is touched (each list names what was)
    assert changes['globals'] == []  # e.g. checkpoint_hook.open, builtins
    assert changes['schemes'] == []  # mmengine's CheckpointLoader
    assert changes['backends'] == []  # mmengine's file backends
    assert changes['hooks'] == []
    assert changes['model_wrappers'] == []
    assert changes['loggers'] == []  # the root logger and every other one
    assert changes['new_loggers_configured'] == []
    assert changes['safe_globals'] == []  # torch's weights_only allowlist
    # the package logger is left as logging.getLogger makes it
    assert report['after_package']['package_logger'] == ['NOTSET', []]
    # ... and the model is registered
    after = report['after_package']
    assert 'MMPosMLP' in after['mmdet'] and 'MMPosMLP' in after['mmseg']
    assert after['timm'] is True
    assert after['benchmark_modules'] == []
    assert after['pkg_resources_warning_hidden'] is False


def test_importing_the_runtime_registers_its_components(runtime_report):
    changes = runtime_report['runtime']
    assert sorted(changes['hooks']) == ['AtomicCheckpointHook',
                                        'CompileBackboneHook']
    assert changes['backends'] == ['local_atomic']
    assert changes['model_wrappers'] == ['CPUCompatibleDDP']
    assert changes['schemes'] == ['']  # mmengine's loader for local files
    # the package's log records go to the run's log; nothing else is
    # configured, and still no global of another library is replaced
    assert runtime_report['after_runtime']['package_logger'] == [
        'INFO', ['RunLogHandler']]
    assert changes['loggers'] == ['posmlp_dense']
    assert changes['globals'] == []
    assert changes['safe_globals'] == []
    assert runtime_report['after_runtime'][
        'pkg_resources_warning_hidden'] is False
    assert runtime_report['after_runtime']['benchmark_modules'] == []


def test_runtime_components_are_mmengines_extension_points():
    """What the runtime registers is found the way configs name it."""
    pytest.importorskip('mmengine')
    import posmlp_dense.openmmlab.runtime as runtime
    from mmengine.fileio import get_file_backend
    from mmengine.registry import HOOKS, MODEL_WRAPPERS
    from mmengine.runner.checkpoint import CheckpointLoader
    hook = HOOKS.build(dict(type='AtomicCheckpointHook', interval=1))
    assert isinstance(hook, runtime.AtomicCheckpointHook)
    hook = HOOKS.build(dict(type='CompileBackboneHook', dynamic=True))
    assert isinstance(hook, runtime.CompileBackboneHook)
    assert hook.compile_cfg == dict(dynamic=True)
    assert isinstance(get_file_backend('/x', backend_args=dict(
        backend='local_atomic')), runtime.AtomicLocalBackend)
    assert MODEL_WRAPPERS.get('CPUCompatibleDDP') is runtime.CPUCompatibleDDP
    assert CheckpointLoader._get_checkpoint_loader('/x/epoch_1.pth') is \
        runtime.load_from_local_weights_only
