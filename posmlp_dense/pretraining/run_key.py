"""What makes a pretraining run the same run, so its checkpoint can be reused.

The demo reuses the checkpoint an earlier ``tools/pretrain.py`` run left in
its output folder only when that run had the same key: the same command
line, the recipe and architecture it resolved to (they live in code and
configs, which can change under the same command), and the same data (the
content hash in the built-in set's ``manifest.json``). The key is written
beside the checkpoint (``run_key.json``) after the run finished, and
removed before a new run starts, so an interrupted run is never reused.
"""
from __future__ import annotations

import json
import os
import os.path as osp
from typing import List, Tuple

from ..atomic_io import atomic_write_bytes
from .checkpoints import LAST
from .cli import build_parser, recipe_from_args
from .model_factory import arch_from_config

KEY_FILE = 'run_key.json'


def data_fingerprint(root: str) -> str:
    """The content hash of a built-in set (its ``manifest.json``); a tree
    without one cannot be told apart from a changed one."""
    path = osp.join(root, 'manifest.json')
    try:
        with open(path, encoding='utf-8') as f:
            digest = json.load(f).get('content_hash')
    except (OSError, ValueError) as err:
        raise ValueError(f'{root}: no readable manifest.json ({err}); the '
                         'checkpoint of a run on it cannot be keyed') from err
    if not isinstance(digest, str):
        raise ValueError(f'{path} holds no content_hash')
    return digest


def run_key(argv: List[str]) -> dict:
    """The key of ``tools/pretrain.py ARGV``: the arguments, the resolved
    recipe and architecture, and the data's content hash."""
    args = build_parser().parse_args(argv)
    arch = arch_from_config(args.arch_from_config) \
        if args.arch_from_config else args.arch
    key = dict(command=list(argv), recipe=recipe_from_args(args).as_dict(),
               model=args.model, arch=arch,
               data=data_fingerprint(args.data))
    return json.loads(json.dumps(key))  # tuples as lists, as once stored


def checkpoint_path(output: str) -> str:
    return osp.join(output, LAST)


def reuse_check(output: str, key: dict) -> Tuple[bool, str]:
    """Whether ``output`` holds a finished run with ``key``, and why not."""
    ckpt = checkpoint_path(output)
    if not osp.isfile(ckpt):
        return False, f'no checkpoint at {ckpt}'
    try:
        with open(osp.join(output, KEY_FILE), encoding='utf-8') as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return False, (f'{ckpt} has no readable {KEY_FILE} (an interrupted '
                       'or foreign run)')
    differs = sorted(k for k in set(key) | set(stored)
                     if key.get(k) != stored.get(k))
    if differs:
        return False, (f'{ckpt} was made by another run: its '
                       f'{", ".join(differs)} differ')
    return True, f'{ckpt} was made by this same run'


def forget(output: str) -> None:
    """Remove the key before a new run writes into ``output``."""
    path = osp.join(output, KEY_FILE)
    if osp.isfile(path):
        os.remove(path)


def record(output: str, key: dict) -> None:
    """Write the key after the run finished."""
    atomic_write_bytes((json.dumps(key, indent=1) + '\n').encode('utf-8'),
                       osp.join(output, KEY_FILE))
