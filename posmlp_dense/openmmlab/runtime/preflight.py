"""Check, before any runner is built, that every file a config needs exists.

A run that would stop on a missing annotation file, and then on the next
missing checkpoint, one at a time and each with a traceback, instead stops at
once with one list of everything missing, each entry with its fix::

    from posmlp_dense.openmmlab.runtime import preflight
    problems = preflight.find_missing(cfg, mode='train', resume=args.resume)
    preflight.exit_if_missing(problems, 'configs/x.py', 'train')  # status 2

What is checked, for ``mode='train'`` (what ``Runner.train`` reads):

* every dataset of ``train_dataloader`` and, when ``val_cfg`` is set,
  ``val_dataloader`` (through wrappers such as RepeatDataset, ConcatDataset,
  ClassBalancedDataset, MultiImageMixDataset): ``data_root``, ``ann_file``
  and each ``data_prefix`` folder, joined exactly as mmengine's
  ``BaseDataset._join_prefix`` joins them (a relative path is joined to a
  non-empty ``data_root``; an absolute one is used as it is);
* the ``ann_file`` of ``val_evaluator`` (COCO metrics read it as it is);
* every ``init_cfg`` of type ``Pretrained`` and every ``pretrained`` path
  anywhere in ``model`` (``Runner.train`` initializes the weights even when
  it then resumes);
* ``load_from``, and the checkpoint given to ``--resume``.

For ``mode='test'`` (``Runner.test`` does not initialize weights): the
datasets of ``test_dataloader``, ``test_evaluator``'s ``ann_file`` and the
checkpoint to evaluate. URLs and other remote paths (``http://``,
``open-mmlab://``, ``s3://``, a non-local ``backend_args``) are not checked.
"""
from __future__ import annotations

import os
import os.path as osp
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

from mmengine.config import Config
from mmengine.fileio import join_path
from mmengine.utils import is_abs

EXIT_STATUS = 2
WRAPPER_KEYS = ('dataset', 'datasets')
LOCAL_BACKENDS = (None, 'local', 'local_atomic')

AUTHORS_REPO = 'https://github.com/Zhicaiwww/PosMLP'
POSMLP_T_DOWNLOADS = (
    'https://drive.google.com/file/d/1wl0JzFqmdbhRAp2WEgl0dVFW5jnoS6bM/view',
    'https://pan.baidu.com/s/1x611r3q1mWO3kv1F0OGhqg?pwd=8781')
COCO_DOWNLOAD = 'https://cocodataset.org/#download'
ADE20K_DOWNLOAD = ('http://data.csail.mit.edu/places/ADEchallenge/'
                   'ADEChallengeData2016.zip')
ARCH_NAMES = {'t': 'PosMLP-T', 's': 'PosMLP-S', 'b': 'PosMLP-B',
              'tiny': 'PosMLP-T', 'small': 'PosMLP-S', 'base': 'PosMLP-B'}


@dataclass
class Missing:
    """One file or folder the run needs and does not find."""
    what: str   # e.g. 'train_dataloader.dataset: annotation file'
    path: str
    fix: str    # how to make it exist or not needed (may span lines)


# ---------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------


def _is_remote(path: str) -> bool:
    return '://' in path or path.startswith('s3:')


def _type_name(cfg) -> str:
    value = cfg.get('type', '') if isinstance(cfg, dict) else ''
    name = value if isinstance(value, str) else getattr(value, '__name__',
                                                        str(value))
    return name.rsplit('.', 1)[-1]


def _leaf_datasets(cfg, key: str) -> Iterator[Tuple[str, dict]]:
    """(key path, dataset cfg) of every dataset that reads files, through
    dataset wrappers (``dataset=`` / ``datasets=[...]``)."""
    if not isinstance(cfg, dict):
        return
    wrapped = False
    for name in WRAPPER_KEYS:
        inner = cfg.get(name)
        if isinstance(inner, dict):
            wrapped = True
            yield from _leaf_datasets(inner, f'{key}.{name}')
        elif isinstance(inner, (list, tuple)):
            wrapped = True
            for i, item in enumerate(inner):
                yield from _leaf_datasets(item, f'{key}.{name}.{i}')
    if not wrapped:
        yield key, cfg


def dataset_paths(dataset: dict) -> Tuple[Optional[str], List[Tuple[str,
                                                                     str]]]:
    """``(data_root, [(role, path), ...])`` as mmengine's BaseDataset joins
    them: ``ann_file`` and each ``data_prefix`` entry, relative ones joined
    to a non-empty ``data_root``."""
    data_root = dataset.get('data_root') or None
    paths = []
    ann_file = dataset.get('ann_file')
    if isinstance(ann_file, str) and ann_file:
        if not is_abs(ann_file) and data_root:
            ann_file = join_path(data_root, ann_file)
        paths.append(('annotation file', ann_file))
    prefixes = dataset.get('data_prefix') or {}
    for name, prefix in sorted(prefixes.items()):
        if not isinstance(prefix, str):
            continue  # the dataset itself raises a TypeError naming it
        if not is_abs(prefix) and data_root:
            prefix = join_path(data_root, prefix)
        if prefix:
            paths.append((f'folder data_prefix.{name}', prefix))
    return data_root, paths


def _dataset_family(dataset: dict) -> str:
    root = str(dataset.get('data_root') or '')
    type_name = _type_name(dataset)
    if 'demo_coco' in root or 'demo_ade' in root:
        return 'demo'
    if 'Coco' in type_name:
        return 'coco'
    if 'ADE20K' in type_name or 'ADEChallengeData2016' in root:
        return 'ade20k'
    return 'other'


def _layout(root: Optional[str], paths: List[Tuple[str, str]]) -> str:
    lines = []
    for role, path in paths:
        shown = osp.relpath(path, root) if root and not _is_remote(path) \
            and path.startswith(root.rstrip('/')) else path
        kind = 'file' if role == 'annotation file' else 'folder of images' \
            if 'img' in role else 'folder'
        slash = '' if kind == 'file' else '/'
        lines.append(f'      {shown.rstrip("/")}{slash}   ({kind})')
    head = f'    {root.rstrip("/")}/' if root else '    (paths relative to ' \
        'the working directory)'
    return '\n'.join([head] + lines)


def _override(group: '_DataGroup') -> str:
    options = [f'{key}.data_root=/path/to/it/' for key in group.keys]
    for key, path in group.evaluators:
        rel = osp.relpath(path, group.root) if group.root else path
        options.append(f'{key}.ann_file=/path/to/it/{rel}')
    return f'or point the config at your copy: --cfg-options ' \
        f'{" ".join(options)}'


def _group_fix(group: '_DataGroup') -> str:
    if group.family == 'demo':
        return ('the built-in demo data: make it with '
                '`python tools/make_demo_data.py` (seconds; writes '
                'data/demo_coco and data/demo_ade).')
    layout = _layout(group.root, group.paths)
    if group.family == 'coco':
        return (f'COCO 2017: download the train/val images and the '
                f'annotations from {COCO_DOWNLOAD} and unpack them so that\n'
                f'{layout}\n  {_override(group)}')
    if group.family == 'ade20k':
        return (f'ADE20K (SceneParsing, 150 classes): download '
                f'{ADE20K_DOWNLOAD} and unzip it so that\n{layout}\n  '
                f'{_override(group)}')
    return f'{group.type_name} expects\n{layout}\n  {_override(group)}'


def _local_backend(dataset: dict) -> bool:
    backend = (dataset.get('backend_args') or {}).get('backend')
    return backend in LOCAL_BACKENDS


@dataclass
class _DataGroup:
    """The datasets of one family under one root: one fix for all."""
    family: str
    root: Optional[str]
    type_name: str
    keys: List[str] = field(default_factory=list)
    paths: List[Tuple[str, str]] = field(default_factory=list)
    evaluators: List[Tuple[str, str]] = field(default_factory=list)


def _missing_data(root: Optional[str], paths: List[Tuple[str, str]]
                  ) -> List[Tuple[str, str]]:
    """(role, path) missing: the root alone when it is missing (the fix
    lists what goes in it), else each missing file and folder."""
    if root and not _is_remote(root) and not osp.isdir(root):
        return [('data root', root)]
    missing = []
    for role, path in paths:
        if _is_remote(path):
            continue
        exists = osp.isfile(path) if role == 'annotation file' \
            else osp.isdir(path)
        if not exists:
            missing.append((role, path))
    return missing


def _evaluator_ann_files(cfg: Config, keys: List[str]):
    for key in keys:
        evaluators = cfg.get(key)
        items = list(enumerate(evaluators)) if isinstance(
            evaluators, (list, tuple)) else [(None, evaluators)]
        for i, evaluator in items:
            if not isinstance(evaluator, dict):
                continue
            ann_file = evaluator.get('ann_file')
            if isinstance(ann_file, str) and ann_file and \
                    not _is_remote(ann_file):
                yield (key if i is None else f'{key}.{i}', evaluator,
                       ann_file)


def _under(path: str, folder: str) -> bool:
    path, folder = osp.normpath(path), osp.normpath(folder)
    return path == folder or path.startswith(folder + os.sep)


def check_data(cfg: Config, loader_keys: List[str],
               evaluator_keys: List[str]) -> List[Missing]:
    """Datasets of the dataloaders (through wrappers) and the annotation
    files of the evaluators (COCO metrics read theirs as given)."""
    groups: Dict[Tuple[str, Optional[str]], _DataGroup] = {}
    found = []  # (what, path, group)
    seen = set()
    for loader_key in loader_keys:
        loader = cfg.get(loader_key)
        if not isinstance(loader, dict):
            continue
        for key, dataset in _leaf_datasets(loader.get('dataset'),
                                           f'{loader_key}.dataset'):
            if not _local_backend(dataset):
                continue
            root, paths = dataset_paths(dataset)
            name = _type_name(dataset) or 'dataset'
            family = _dataset_family(dataset)
            group = groups.setdefault((family, root),
                                      _DataGroup(family, root, name))
            group.keys.append(key)
            group.paths += [p for p in paths if p not in group.paths]
            for role, path in _missing_data(root, paths):
                if (key, path) not in seen:
                    seen.add((key, path))
                    found.append((f'{key} ({name}): {role}', path, group))
    for key, evaluator, ann_file in _evaluator_ann_files(cfg,
                                                         evaluator_keys):
        if osp.isfile(ann_file):
            continue
        covering = [group for _, path, group in found
                    if _under(ann_file, path)]
        if covering:  # listed already, itself or a folder above it
            covering[0].evaluators.append((key, ann_file))
            continue
        found.append((f'{key} ({_type_name(evaluator)}): annotation file',
                      ann_file, None))
    missing = []
    for what, path, group in found:
        fix = _group_fix(group) if group is not None else (
            'the evaluator reads the ground truth from this file: put it '
            'there (the annotation file of the evaluated set) or point the '
            f'config at it: --cfg-options {what.split(" ")[0]}.ann_file='
            '/path/to/it.json')
        missing.append(Missing(what, path, fix))
    return missing


# ---------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------


def _pretrained_entries(node, key: str, owner: Optional[dict] = None
                        ) -> Iterator[Tuple[str, str, dict, str]]:
    """(checkpoint key path, path, owning module cfg, key path of the
    setting to drop) for every init_cfg Pretrained and ``pretrained``."""
    if isinstance(node, dict):
        for name, value in node.items():
            sub = f'{key}.{name}'
            if name == 'init_cfg':
                inits = value if isinstance(value, (list, tuple)) \
                    else [value]
                for i, init in enumerate(inits):
                    if isinstance(init, dict) and \
                            init.get('type') == 'Pretrained' and \
                            isinstance(init.get('checkpoint'), str):
                        where = sub if len(inits) == 1 and \
                            isinstance(value, dict) else f'{sub}.{i}'
                        yield (f'{where}.checkpoint', init['checkpoint'],
                               node, sub)
            elif name == 'pretrained' and isinstance(value, str) and value:
                yield sub, value, node, sub
            else:
                yield from _pretrained_entries(value, sub, node)
    elif isinstance(node, (list, tuple)):
        for i, item in enumerate(node):
            yield from _pretrained_entries(item, f'{key}.{i}', owner)


def _posmlp_arch(module_cfg: dict) -> Optional[object]:
    """The arch of a PosMLP module config, None for other modules."""
    if _type_name(module_cfg) != 'PosMLP':
        return None
    return module_cfg.get('arch', 't')


def pretrain_command(arch) -> str:
    if isinstance(arch, str):
        model = f'posmlp_{arch[0].lower()}'
        return (f'torchrun --nproc_per_node=8 tools/pretrain.py --model '
                f'{model} --data /path/to/imagenet --output '
                f'work_dirs/pretrain/{model}')
    return ('torchrun --nproc_per_node=8 tools/pretrain.py '
            '--arch-from-config CONFIG --data /path/to/imagenet '
            '--output work_dirs/pretrain/custom')


def _posmlp_weights_fix(arch, checkpoint_key: str, drop_key: str,
                        path: str) -> str:
    scratch = (f'or train the backbone from scratch: --cfg-options '
               f'{drop_key}=None')
    if isinstance(arch, str) and ARCH_NAMES.get(arch.lower()) == 'PosMLP-T':
        return (f'PosMLP-T ImageNet-1k weights are published by the authors '
                f'({AUTHORS_REPO}, README, "Download" column): '
                f'{POSMLP_T_DOWNLOADS[0]} or {POSMLP_T_DOWNLOADS[1]}. Save '
                f'the file as {path} (it is read as it is), or keep only the '
                f'backbone: python tools/convert_checkpoint.py DOWNLOADED.pth '
                f'{path}\n  or use another copy: --cfg-options '
                f'{checkpoint_key}=/path/to/it.pth\n  {scratch}')
    if isinstance(arch, str) and arch.lower() in ARCH_NAMES:
        name = ARCH_NAMES[arch.lower()]
        return (f'{name} ImageNet weights were never released (the authors\' '
                f'README lists PosMLP-S as "released soon" and has no '
                f'PosMLP-B download). Pretrain them on ImageNet-1k with the '
                f'published recipe (docs/weights.md):\n'
                f'    {pretrain_command(arch)}\n'
                f'  then: --cfg-options {checkpoint_key}='
                f'work_dirs/pretrain/posmlp_{arch[0].lower()}/last.pth\n'
                f'  {scratch}')
    return (f'no published weights exist for a custom PosMLP arch; pretrain '
            f'this arch (tools/pretrain.py --arch-from-config reads it from '
            f'the config):\n    {pretrain_command(arch)}\n  then: '
            f'--cfg-options {checkpoint_key}=<output>/last.pth\n  {scratch}')


def check_checkpoints(cfg: Config) -> List[Missing]:
    missing = []
    for key, path, owner, drop_key in _pretrained_entries(
            cfg.get('model') or {}, 'model'):
        if _is_remote(path) or osp.isfile(path):
            continue
        arch = _posmlp_arch(owner)
        if isinstance(owner, dict) and _type_name(owner) == 'PosMLP':
            label = ARCH_NAMES.get(str(arch).lower(), 'custom PosMLP') \
                if isinstance(arch, str) else 'custom PosMLP'
            fix = _posmlp_weights_fix(arch, key, drop_key, path)
            what = f'{key}: {label} ImageNet weights'
        else:
            fix = (f'put the checkpoint there, point the config at it '
                   f'(--cfg-options {key}=/path/to/it.pth), or drop it: '
                   f'--cfg-options {drop_key}=None')
            what = f'{key}: pretrained weights'
        missing.append(Missing(what, path, fix))
    return missing


def _checkpoint_missing(path) -> bool:
    return isinstance(path, str) and bool(path) and not _is_remote(path) \
        and not osp.isfile(path)


def check_run_checkpoints(cfg: Config, mode: str, resume: Optional[str],
                          checkpoint: Optional[str]) -> List[Missing]:
    missing = []
    if mode == 'test':
        if _checkpoint_missing(checkpoint):
            missing.append(Missing(
                'checkpoint to evaluate', checkpoint,
                'give the path of a trained checkpoint (e.g. '
                'work_dirs/<config>/epoch_12.pth), or none to evaluate the '
                "config's freshly initialized model"))
        return missing
    if resume not in (None, 'auto'):
        if _checkpoint_missing(resume):
            missing.append(Missing(
                'checkpoint to resume from (--resume)', resume,
                'give an existing checkpoint, or --resume without a value '
                "to resume from the work dir's last checkpoint"))
        return missing  # --resume CKPT replaces load_from
    load_from = cfg.get('load_from')
    if _checkpoint_missing(load_from):
        what = 'checkpoint to resume from (load_from with resume=True)' \
            if cfg.get('resume') else 'load_from (weights to start from)'
        missing.append(Missing(
            what, load_from,
            'fix the path, or drop it: --cfg-options load_from=None'))
    return missing


# ---------------------------------------------------------------------------
# the whole check
# ---------------------------------------------------------------------------


def find_missing(cfg: Config, mode: str = 'train',
                 resume: Optional[str] = None,
                 checkpoint: Optional[str] = None) -> List[Missing]:
    """Everything ``mode`` ('train' or 'test') needs and does not find.

    ``resume`` is the value of train.py's ``--resume`` (None, 'auto' or a
    path); ``checkpoint`` is test.py's checkpoint argument.
    """
    if mode not in ('train', 'test'):
        raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
    if mode == 'train':
        loaders = ['train_dataloader']
        evaluators = []
        if cfg.get('val_cfg') is not None and \
                cfg.get('val_dataloader') is not None:
            loaders.append('val_dataloader')
            evaluators.append('val_evaluator')
    else:
        loaders, evaluators = ['test_dataloader'], ['test_evaluator']
    missing = check_data(cfg, loaders, evaluators)
    if mode == 'train':
        missing += check_checkpoints(cfg)
    missing += check_run_checkpoints(cfg, mode, resume, checkpoint)
    return missing


def format_report(missing: List[Missing], config_path: str,
                  mode: str) -> str:
    """One list: every missing path, then each distinct fix once, naming
    the entries it fixes."""
    lines = [f'preflight: {config_path} cannot {mode}: {len(missing)} '
             f'file{"s" if len(missing) != 1 else ""} or folder'
             f'{"s" if len(missing) != 1 else ""} missing', '']
    fixes: Dict[str, List[int]] = {}
    for number, item in enumerate(missing, 1):
        lines.append(f'  [{number}] {item.what}: {item.path}')
        fixes.setdefault(item.fix, []).append(number)
    lines += ['', 'how to fix:']
    for fix, numbers in fixes.items():
        refs = ', '.join(f'[{n}]' for n in numbers)
        lines.append(f'  {refs} {fix}')
    lines += ['', 'Nothing was run. (--skip-preflight skips these checks.)']
    return '\n'.join(lines)


def exit_if_missing(missing: List[Missing], config_path: str,
                    mode: str) -> None:
    """Print the list (on rank 0) and exit with status 2, or return."""
    if not missing:
        return
    if os.environ.get('RANK', '0') == '0':
        print(format_report(missing, config_path, mode), file=sys.stderr,
              flush=True)
    raise SystemExit(EXIT_STATUS)


def run(cfg: Config, config_path: str, mode: str = 'train',
        resume: Optional[str] = None,
        checkpoint: Optional[str] = None) -> None:
    """find_missing + exit_if_missing: what train.py and test.py call."""
    exit_if_missing(find_missing(cfg, mode, resume, checkpoint),
                    config_path, mode)


__all__ = ['Missing', 'find_missing', 'format_report', 'exit_if_missing',
           'run', 'dataset_paths', 'pretrain_command', 'EXIT_STATUS']
