"""What a run records of its machine, and the malloc settings under which
a CPU run keeps freed memory."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from typing import Dict

import torch

from posmlp_dense.optional_deps import is_installed

# the folder holding benchmarks/ and posmlp_dense/: the git checkout
SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('timm', 'onnx', 'onnxscript', 'onnxruntime', 'mmengine',
            'mmcv', 'mmdet')

# Settings that change how malloc hands memory back to the OS, and so the
# page faults of every CPU step: runs under different ones do not compare.
ALLOCATOR_SETTINGS = ('GLIBC_TUNABLES', 'MALLOC_MMAP_THRESHOLD_',
                      'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_MAX_',
                      'MALLOC_TOP_PAD_', 'LD_PRELOAD')

# glibc tunables under which no freed block goes back to the OS, so a step
# reuses its predecessor's pages as a GPU's caching allocator reuses its
# blocks. glibc reads them when a process starts.
KEEP_FREED_MEMORY = ('glibc.malloc.mmap_threshold=4294967296',
                     'glibc.malloc.trim_threshold=68719476736')


def keeps_freed_memory() -> bool:
    current = os.environ.get('GLIBC_TUNABLES', '').split(':')
    return all(t in current for t in KEEP_FREED_MEMORY)


def environment_keeping_freed_memory() -> Dict[str, str]:
    """This process's environment with KEEP_FREED_MEMORY added to
    GLIBC_TUNABLES (other tunables kept), for a child process."""
    if platform.libc_ver()[0] != 'glibc':
        raise RuntimeError(
            "keeping freed memory needs glibc's malloc (Linux); this Python "
            f'runs on {platform.libc_ver()[0] or "another C library"}')
    env = dict(os.environ)
    names = {t.split('=')[0] for t in KEEP_FREED_MEMORY}
    kept = [t for t in env.get('GLIBC_TUNABLES', '').split(':')
            if t and t.split('=')[0] not in names]
    env['GLIBC_TUNABLES'] = ':'.join(kept + list(KEEP_FREED_MEMORY))
    return env


def _git(*args: str) -> str:
    return subprocess.run(['git', *args], cwd=SOURCE_ROOT, text=True,
                          capture_output=True, timeout=10).stdout


def environment(device: torch.device) -> dict:
    env = dict(
        time=datetime.datetime.now().isoformat(timespec='seconds'),
        python=platform.python_version(), torch=torch.__version__,
        threads=torch.get_num_threads(), cpu_count=os.cpu_count(),
        device=str(device),
        allocator={name: os.environ[name] for name in ALLOCATOR_SETTINGS
                   if os.environ.get(name)})
    env.update((name, metadata.version(name)) for name in PACKAGES
               if is_installed(name))  # importable, not merely on disk
    if os.path.exists('/proc/cpuinfo'):
        with open('/proc/cpuinfo') as f:
            models = [line.split(':', 1)[1].strip() for line in f
                      if line.startswith('model name')]
        if models:
            env['cpu_model'] = models[0]
    if hasattr(os, 'getloadavg'):
        env['loadavg_start'] = os.getloadavg()
    if device.type == 'cuda':
        env.update(cuda_device=torch.cuda.get_device_name(device),
                   cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
    try:
        env['git_commit'] = _git('rev-parse', 'HEAD').strip()
        env['git_dirty_files'] = [line[3:] for line in _git(
            'status', '--porcelain', '--untracked-files=no').splitlines()]
    except (OSError, subprocess.SubprocessError):
        pass  # not a checkout: the report says '?'
    return env
