"""Checkpoints: safe reading, published-format conversion, checked loading.

Supported inputs:

* released ImageNet checkpoints (timm's saver: ``state_dict``,
  ``state_dict_ema``, ``args`` as an ``argparse.Namespace``, ...);
* checkpoints this project writes (a flat or ``{'state_dict': ...}`` dict,
  ``.pth`` or ``.safetensors``);
* mmdet / mmseg training checkpoints (weights under ``backbone.``).

Files are read with ``torch.load(weights_only=True)``: nothing in a file can
run code. Only the few non-tensor types a released checkpoint needs are
allowed (see ``safe_globals``).
"""
from __future__ import annotations

import argparse
import io
import logging
import os
import pickle
import re
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from . import atomic_io
from .archs import describe_weights, infer_config  # noqa: F401 (public here)
from .errors import CheckpointError
from .gates.position_bias import DERIVED_BUFFERS

logger = logging.getLogger('posmlp_dense')

# Keys of the classification model that a backbone does not have.
CLASSIFIER_PREFIXES = ('head.', 'norm.')
# How torch's safe unpickler words a refused object (a global that is not
# allowlisted, a call of one, an object of a class that is not allowed) ...
_REFUSED_MARKERS = ('GLOBAL', 'unrecognized function',
                    'Can only create new object', 'Can only build')
# ... and bytes that are no pickle at all.
_CORRUPT_MARKERS = ('Unsupported operand', 'String is too long',
                    'unsupported persistent id')


@contextmanager
def allowing(types: List[object]):
    """Allow ``types`` in ``weights_only`` loading for the duration of the
    block. Only those not allowed already are added: leaving torch's
    ``safe_globals`` context removes what it was given, and what the user
    allowed must stay allowed."""
    allowed = torch.serialization.get_safe_globals()
    with torch.serialization.safe_globals(
            [t for t in types if t not in allowed]):
        yield


def safe_globals() -> List[object]:
    """Types allowed by ``weights_only`` loading besides tensors/containers."""
    # the published checkpoints store their training arguments ('args')
    return [argparse.Namespace]


def _refuse_non_checkpoint(path: str):
    """Name the usual impostors: a Git LFS pointer, a saved error page."""
    with open(path, 'rb') as f:
        head = f.read(256)
    if head.startswith(b'version https://git-lfs'):
        raise CheckpointError(f'{path} is a Git LFS pointer file, not the '
                              f'checkpoint itself; fetch the real file (git '
                              f'lfs pull)')
    if head.lstrip().lower().startswith((b'<!doctype html', b'<html',
                                         b'<?xml')):
        raise CheckpointError(f'{path} is an HTML/XML page (a failed '
                              f'download?), not a checkpoint')


# torch's advice to retry with weights_only=False or to allowlist what it
# refused, and miniz's boilerplate: none of it helps with a damaged or
# malicious file
_BOILERPLATE = (' In PyTorch 2.6', ' This is an internal miniz error',
                ' Please use `torch.serialization.add_safe_globals')


def _short(reason: str) -> str:
    for marker in _BOILERPLATE:
        reason = reason.split(marker, 1)[0]
    return reason.replace('WeightsUnpickler error: ', '').strip()


def read_checkpoint(path: str, map_location='cpu') -> dict:
    """Read a ``.pth``/``.pt``/``.safetensors`` file safely into a dict.

    ``map_location`` as in ``torch.load`` (safetensors: a device name, else
    the CPU)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f'checkpoint path {path} is a directory, not '
                                f'a checkpoint file')
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint not found: {path}')
    if os.path.getsize(path) == 0:
        raise CheckpointError(f'cannot read checkpoint {path}: the file is '
                              f'empty (0 bytes), e.g. cut off while it was '
                              f'being written')
    _refuse_non_checkpoint(path)
    if path.endswith('.safetensors'):
        from safetensors import SafetensorError
        from safetensors.torch import load_file
        try:
            device = map_location if isinstance(map_location, str) else 'cpu'
            return dict(load_file(path, device=device))
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f'cannot read safetensors checkpoint '
                                  f'{path}: it is truncated or corrupt '
                                  f'({err})') from err
    try:
        with allowing(safe_globals()):
            ckpt = torch.load(path, map_location=map_location,
                              weights_only=True)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines()
                 if line.strip()]
        refused = next((line for line in lines
                        if any(m in line for m in _REFUSED_MARKERS)), None)
        if refused is not None:
            raise CheckpointError(
                f'refused to load {path}: it contains pickled Python objects '
                f'that safe loading (weights_only=True) does not allow, and '
                f'they were not run. Detail: {_short(refused)}') from err
        # anything else the safe unpickler trips over is not a pickle at
        # all: random bytes, a cut-off legacy file, another format
        reason = next((line for line in lines
                       if line.startswith(_CORRUPT_MARKERS)),
                      lines[-1] if lines else type(err).__name__)
        raise CheckpointError(
            f'cannot read checkpoint {path}: the file is truncated or corrupt '
            f'(not a valid checkpoint: {_short(reason)})') from err
    except MemoryError:
        raise
    except Exception as err:  # noqa: BLE001
        # RuntimeError/BadZipFile/EOFError for a cut-off or damaged file; on
        # random bytes the unpickler can also fail with IndexError, KeyError,
        # UnicodeDecodeError, ...
        reason = str(err).strip() or (
            'the data ends early' if isinstance(err, EOFError) else '')
        if not isinstance(err, (RuntimeError, EOFError, zipfile.BadZipFile,
                                OSError)) or not reason:
            reason = f'{type(err).__name__}: {reason}'.rstrip(': ')
        raise CheckpointError(f'cannot read checkpoint {path}: the file is '
                              f'truncated or corrupt ({_short(reason)})'
                              ) from err
    if not isinstance(ckpt, dict):
        raise CheckpointError(f'checkpoint {path} holds a {type(ckpt).__name__}'
                              f', not a dict of weights')
    return ckpt


def extract_state_dict(ckpt: Mapping, which: str = 'ema'
                       ) -> Tuple[Dict[str, torch.Tensor], str]:
    """Pick the weights out of a checkpoint dict; returns (weights, entry)."""
    if which not in ('ema', 'raw'):
        raise ValueError(f"which must be 'ema' or 'raw', got {which!r}")
    entries = ('state_dict_ema', 'state_dict', 'model') if which == 'ema' \
        else ('state_dict', 'model')
    for entry in entries:
        value = ckpt.get(entry)
        if isinstance(value, Mapping):
            return dict(value), entry
    if ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
        return dict(ckpt), ''
    raise CheckpointError(
        f'no weights found in the checkpoint: expected one of {entries} or a '
        f'flat dict of tensors, found keys {sorted(ckpt)[:10]}')


def strip_prefix(state: Dict[str, torch.Tensor], prefix: Optional[str],
                 anchor: str = 'patch_embed.projs.0.weight'
                 ) -> Tuple[Dict[str, torch.Tensor], str]:
    """Remove ``module.`` and a model prefix such as ``backbone.``.

    With ``prefix=None`` the prefix is found from where the stem's first
    conv sits (e.g. ``backbone.`` in an mmdet/mmseg checkpoint).
    """
    if state and all(k.startswith('module.') for k in state):
        state = {k[len('module.'):]: v for k, v in state.items()}
    if prefix is None:
        hits = [k[:-len(anchor)] for k in state if k.endswith(anchor)]
        if not hits:
            raise CheckpointError(
                f'the checkpoint has no PosMLP stem ({anchor!r} under any '
                f'prefix); it is not a PosMLP checkpoint')
        prefix = min(hits, key=len)
    if prefix and not prefix.endswith('.'):
        prefix += '.'
    picked = {k[len(prefix):]: v for k, v in state.items()
              if k.startswith(prefix)}
    if not picked:
        raise CheckpointError(f'no checkpoint key starts with prefix '
                              f'{prefix!r}')
    return picked, prefix


@dataclass
class LoadReport:
    """What ``load_pretrained`` did with every key."""
    source: str
    entry: str
    prefix: str = ''
    loaded: List[str] = field(default_factory=list)
    resized: List[Tuple[str, tuple, tuple]] = field(default_factory=list)
    skipped_classifier: List[str] = field(default_factory=list)
    dropped_derived: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f'loaded {len(self.loaded)} tensors from {self.source}'
                 + (f' [{self.entry}]' if self.entry else '')
                 + (f' (prefix {self.prefix!r})' if self.prefix else '')]
        if self.resized:
            lines.append(f'  resized for the model\'s windows: '
                         f'{len(self.resized)} tensors, e.g. '
                         f'{self.resized[0][0]} {self.resized[0][1]} -> '
                         f'{self.resized[0][2]}')
        if self.dropped_derived:
            lines.append(f'  dropped {len(self.dropped_derived)} derived '
                         f'buffers (recomputed from the window size)')
        if self.skipped_classifier:
            lines.append(f'  skipped classifier keys: '
                         f'{self.skipped_classifier}')
        if self.missing:
            lines.append(f'  not in the checkpoint (kept at init): '
                         f'{self.missing}')
        if self.unexpected:
            lines.append(f'  in the checkpoint but not the model (ignored): '
                         f'{self.unexpected}')
        return '\n'.join(lines)


def resizable_keys(model: nn.Module) -> set:
    """State-dict keys whose shape follows the window size: the modules that
    resize them on load declare them (``resizable_tensors``)."""
    keys = set()
    for name, module in model.named_modules():
        for tensor in getattr(module, 'resizable_tensors', ()):
            keys.add(f'{name}.{tensor}' if name else tensor)
    return keys


def _new_module_keys(model: nn.Module) -> Tuple[str, ...]:
    """Model keys that released checkpoints cannot have (added for dense use)."""
    keys = tuple(k for k in model.state_dict() if re.match(r'norm\d+\.', k))
    return keys + ('absolute_pos_embed',)


def load_state(model: nn.Module, state: Dict[str, torch.Tensor],
               source: str = '<state dict>', entry: str = '',
               prefix: str = '', strict: bool = True) -> LoadReport:
    """Load PosMLP weights into ``model`` after checking they fit.

    Derived buffers are dropped, classifier keys skipped when the model has
    no head, window-dependent tensors resized (by the model's load hooks).
    Anything else that is missing or unexpected, and any shape that does not
    match, raises ``CheckpointError`` unless ``strict=False``, in which case
    it is reported (and logged) instead.
    """
    report = LoadReport(source=source, entry=entry, prefix=prefix)
    model_state = model.state_dict()
    weights = {}
    for key, value in state.items():
        if key.rsplit('.', 1)[-1] in DERIVED_BUFFERS:
            report.dropped_derived.append(key)
        elif key not in model_state and key.startswith(CLASSIFIER_PREFIXES):
            report.skipped_classifier.append(key)
        else:
            weights[key] = value
    allowed_missing = _new_module_keys(model)
    report.missing = [k for k in model_state if k not in weights]
    report.unexpected = [k for k in weights if k not in model_state]
    mismatched = []
    resizable = resizable_keys(model)
    for key, value in weights.items():
        if key not in model_state:
            continue
        want = tuple(model_state[key].shape)
        if tuple(value.shape) == want:
            continue
        if key in resizable:
            report.resized.append((key, tuple(value.shape), want))
        else:
            mismatched.append(f'{key}: checkpoint {tuple(value.shape)} vs '
                              f'model {want}')
    hard_missing = [k for k in report.missing
                    if not k.startswith(allowed_missing)]
    if mismatched or hard_missing or report.unexpected:
        message = _mismatch_message(model_state, weights, source, mismatched,
                                    hard_missing, report.unexpected)
        if strict or mismatched:
            raise CheckpointError(message)
        logger.warning(message)
    for key in report.unexpected:
        weights.pop(key)
    model.load_state_dict(weights, strict=False)
    report.loaded = sorted(weights)
    logger.info('%s', report)
    return report


def _mismatch_message(model_state, weights, source, mismatched, missing,
                      unexpected) -> str:
    ours, theirs = describe_weights(model_state), describe_weights(weights)
    parts = [f'checkpoint {source} does not match the model architecture:']
    for name in ('gate', 'depths', 'embed_dims'):
        if ours[name] != theirs[name]:
            parts.append(f'  {name}: checkpoint {theirs[name]} vs model '
                         f'{ours[name]}')
    if mismatched:
        parts.append(f'  {len(mismatched)} shape mismatches, first: '
                     + '; '.join(mismatched[:3]))
    if missing:
        parts.append(f'  {len(missing)} model keys missing from the '
                     f'checkpoint, first: {missing[:3]}')
    if unexpected:
        parts.append(f'  {len(unexpected)} checkpoint keys unknown to the '
                     f'model, first: {unexpected[:3]}')
    return '\n'.join(parts)


def load_pretrained(model: nn.Module, path: str, which: str = 'ema',
                    prefix: Optional[str] = None,
                    strict: bool = True) -> LoadReport:
    """Load a released, converted or mmdet/mmseg checkpoint into a PosMLP.

    Works for the backbone (classifier keys are skipped and reported) and
    for the classifier. ``which='ema'`` reads ``state_dict_ema`` when the
    file has it (as the authors' loader does), ``'raw'`` reads
    ``state_dict``. ``prefix`` selects a sub-model (found automatically when
    None). Returns a LoadReport; raises CheckpointError when the weights do
    not fit the model.
    """
    ckpt = read_checkpoint(path)
    state, entry = extract_state_dict(ckpt, which)
    state, found_prefix = strip_prefix(state, prefix)
    return load_state(model, state, source=os.fspath(path), entry=entry,
                      prefix=found_prefix, strict=strict)


def save_checkpoint(state: Mapping[str, torch.Tensor], path: str,
                    meta: Optional[Dict[str, str]] = None,
                    overwrite: bool = False):
    """Write weights atomically as ``.safetensors`` or ``.pth``.

    The file appears only once complete (written to a temporary file, then
    renamed), and an existing file is never replaced unless ``overwrite``.
    """
    path = os.fspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f'{path} exists; refusing to overwrite it')
    tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    if path.endswith('.safetensors'):
        from safetensors.torch import save
        data = save(tensors, metadata=dict(meta or {}))
    else:
        buffer = io.BytesIO()
        torch.save({'state_dict': tensors, 'meta': dict(meta or {})}, buffer)
        data = buffer.getvalue()
    atomic_io.atomic_write_bytes(data, path)
