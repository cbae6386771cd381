"""The ImageNet classifier: the PosMLP backbone, a final LayerNorm, global
pooling and a linear head, with timm's model interface (the semantics of
timm's Swin and ConvNeXt: ``forward_features``/``forward_head``,
``forward_intermediates``, ``prune_intermediate_layers``,
``reset_classifier`` ...)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn
from timm.layers import SelectAdaptivePool2d, trunc_normal_
from timm.models._features import feature_take_indices
from timm.models._input import update_model_input_size

from .backbone import PosMLP

# What timm's SelectAdaptivePool2d can do on an NCHW map ('' = no pooling).
GLOBAL_POOLS = ('', 'avg', 'max', 'avgmax', 'catavgmax')


def _check_global_pool(global_pool):
    if global_pool not in GLOBAL_POOLS:
        raise ValueError(f'global_pool must be one of {GLOBAL_POOLS}, got '
                         f'{global_pool!r}')


def _make_pool(global_pool) -> SelectAdaptivePool2d:
    _check_global_pool(global_pool)
    # (B, C) after pooling; without pooling the map stays (B, C, H, W)
    return SelectAdaptivePool2d(pool_type=global_pool,
                                flatten=bool(global_pool))


def _check_img_size(img_size) -> Tuple[int, int]:
    size = (img_size, img_size) if isinstance(img_size, int) else img_size
    if not (isinstance(size, (tuple, list)) and len(size) == 2 and all(
            isinstance(s, int) and not isinstance(s, bool) and s > 0
            for s in size)):
        raise ValueError(f'img_size must be a positive int or a pair (H, W) '
                         f'of positive ints, got {img_size!r}')
    return tuple(size)


class PosMLPClassifier(PosMLP):
    """PosMLP with the published classification head.

    State-dict names match the released checkpoints: the backbone's keys
    plus ``norm`` (the final LayerNorm) and ``head`` (the Linear); pooling
    and dropout have no weights.

    Args:
        arch, gate: as for PosMLP.
        num_classes: classes of the head; 0 for none (``forward`` then
            returns the pooled features, ``head_hidden_size`` wide).
        global_pool: 'avg' (published), 'max', 'avgmax', 'catavgmax', or ''
            for none: ``forward`` then returns the unpooled final map
            (B, C, H/32, W/32), classified at every position when there is
            a head (B, num_classes, H/32, W/32).
        drop_rate: dropout before the head.
        img_size: the nominal input size, recorded for timm's data config;
            the model runs at any size (see ``set_input_size``).
        **kwargs: backbone options of PosMLP (``in_channels``,
            ``drop_path_rate``, ``window_size``, ``with_cp`` ...). Its
            dense-prediction outputs (``out_indices``, ``out_norm``) do not
            apply: use ``forward_intermediates`` or timm's
            ``features_only=True``.
    """

    def __init__(self, arch: Union[str, dict] = 't', gate: str = 'gqpe',
                 num_classes: int = 1000, global_pool: str = 'avg',
                 drop_rate: float = 0.0,
                 img_size: Optional[Union[int, Tuple[int, int]]] = None,
                 **kwargs):
        for name in ('out_indices', 'out_norm'):
            if name in kwargs:
                raise TypeError(
                    f'PosMLPClassifier does not take {name!r} (a backbone '
                    f'output option); take levels with forward_intermediates'
                    f'(x, indices=...) or timm.create_model(..., '
                    f'features_only=True, out_indices=...)')
        _check_global_pool(global_pool)  # before building the backbone
        if not 0.0 <= drop_rate < 1.0:
            raise ValueError(f'drop_rate must be in [0, 1), got '
                             f'{drop_rate!r}')
        super().__init__(arch, gate, out_norm=False, **kwargs)
        self.num_features = self.embed_dims[-1]
        self.drop_rate = drop_rate
        self.norm = nn.LayerNorm(self.num_features, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.global_pool = _make_pool(global_pool)
        self.reset_classifier(num_classes)
        if img_size is not None:
            self.set_input_size(img_size)

    # ------------------------------------------------------------- the head
    @property
    def head_hidden_size(self) -> int:
        """Width of the pre-logits features (the pooled final map)."""
        return self.num_features * self.global_pool.feat_mult()

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int,
                         global_pool: Optional[str] = None):
        """A new, freshly initialized head of ``num_classes`` classes (0: no
        head). ``global_pool`` changes the pooling; None keeps it."""
        if not isinstance(num_classes, int) or isinstance(num_classes, bool) \
                or num_classes < 0:
            raise ValueError(f'num_classes must be an int >= 0, got '
                             f'{num_classes!r}')
        if global_pool is not None:
            self.global_pool = _make_pool(global_pool)
        self.num_classes = num_classes
        if num_classes == 0:
            self.head = nn.Identity()
            return
        ref = next(self.parameters())
        head = nn.Linear(self.head_hidden_size, num_classes,
                         device=ref.device, dtype=ref.dtype)
        trunc_normal_(head.weight, std=0.02, a=-2.0, b=2.0)
        nn.init.zeros_(head.bias)
        self.head = head.train(self.training)

    # -------------------------------------------------------------- forward
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The final normalized map, (B, C, H/32, W/32) (after pruning: the
        last kept level's map)."""
        x, _ = super().forward_intermediates(x, indices=1, output_fmt='NHWC')
        return self.norm(x).permute(0, 3, 1, 2)

    def forward_head(self, x: torch.Tensor,
                     pre_logits: bool = False) -> torch.Tensor:
        """Pool (unless global_pool=''), dropout, then the head (skipped
        with ``pre_logits``)."""
        x = self.head_drop(self.global_pool(x))
        if pre_logits:
            return x
        if self.global_pool.is_identity():
            # no pooling: classify every position of the (B, C, H, W) map
            return self.head(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------- timm feature extraction
    def forward_intermediates(
            self, x: torch.Tensor,
            indices: Optional[Union[int, Sequence[int]]] = None,
            norm: bool = False, stop_early: bool = False,
            output_fmt: str = 'NCHW', intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        """Level outputs, as timm's Swin returns them.

        ``indices``: the levels to return (an int n: the last n; None: all),
        in level order; an index out of range raises. ``norm``: the last
        level, when returned, gets the final norm (the other levels have
        none). ``stop_early``: run no level past the last one requested.
        Returns the list of maps, or with ``intermediates_only=False`` the
        pair (final output, maps): the final output is
        ``forward_features(x)`` when the last level ran, else the raw output
        of the last level run.
        """
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NHWC', got "
                             f'{output_fmt!r}')
        take, last = feature_take_indices(len(self.levels), indices)
        final, maps = super().forward_intermediates(
            x, take, stop_early=stop_early, output_fmt='NHWC')
        end = len(self.levels) - 1
        if norm and end in take:  # maps are in level order: it is the last
            maps[-1] = self.norm(maps[-1])
        if output_fmt == 'NCHW':
            maps = [y.permute(0, 3, 1, 2) for y in maps]
        if intermediates_only:
            return maps
        if not stop_early or last == end:
            final = self.norm(final)
        if output_fmt == 'NCHW':
            final = final.permute(0, 3, 1, 2)
        return final, maps

    def prune_intermediate_layers(
            self, indices: Union[int, Sequence[int]] = 1,
            prune_norm: bool = False, prune_head: bool = True) -> List[int]:
        """Drop the levels after the last of ``indices``, as Swin does.

        Ending before the last level removes the final norm and the head
        (both sized for the last level): ``forward_features`` then ends at
        the last kept level and ``num_features`` is its width. Returns the
        kept indices (absolute).
        """
        take, last = feature_take_indices(len(self.levels), indices)
        prune_end = last < len(self.levels) - 1
        if prune_norm or prune_end:
            self.norm = nn.Identity()
        self.levels = self.levels[:last + 1]
        self.specs = self.specs[:last + 1]
        self.embed_dims = self.embed_dims[:last + 1]
        self.frozen_stages = min(self.frozen_stages, last + 1)
        if prune_end:
            self.num_features = self.feature_info[last]['num_chs']
        if prune_head or prune_end:
            self.reset_classifier(0, '')
        return take

    # ------------------------------------------------------ timm utilities
    def set_grad_checkpointing(self, enable: bool = True):
        """Recompute each block in the backward pass (as ``with_cp``)."""
        for level in self.levels:
            level.with_cp = enable

    def group_matcher(self, coarse: bool = False) -> Dict[str, Any]:
        """Parameter groups (timm's layer-wise learning-rate decay): the
        stem, then each level's downsampling with its first block, each
        further block (with ``coarse``: each level); the final norm joins
        the last block and the head comes last, as in Swin."""
        return dict(
            stem=r'^(?:patch_embed|absolute_pos_embed)',
            blocks=r'^levels\.(\d+)' if coarse else [
                (r'^levels\.(\d+)\.pool', (0,)),
                (r'^levels\.(\d+)\.encoder\.(\d+)', None),
                (r'^norm\.', (99999,)),
            ])

    def no_weight_decay(self) -> Set[str]:
        """Parameters exempt from weight decay beyond the ones timm's
        optimizer factory exempts by itself (1-D tensors, ``*.bias``):
        none, as in the published recipe (the authors' model names none, so
        their gate parameters and position tables were decayed)."""
        return set()

    def set_input_size(self,
                       img_size: Optional[Union[int, Tuple[int, int]]] = None):
        """Record a new nominal input size; nothing in the model changes.

        PosMLP needs no resizing to run at another size: each level cuts
        whatever map reaches it into windows (partial windows at the
        borders), the position encodings depend on the window, not on the
        image, and the optional absolute position embedding (``ape``) is
        resized to every input anyway. The size is recorded where timm
        reads a model's current input size
        (``timm.models.get_model_input_config``, reconstruction arguments);
        ``pretrained_cfg`` keeps describing the released weights (trained
        at 224), as in timm's own models. None keeps the current size.
        """
        if img_size is None:
            return
        update_model_input_size(self, _check_img_size(img_size))


def create_posmlp_classifier(arch: Union[str, dict] = 't',
                             gate: str = 'gqpe', num_classes: int = 1000,
                             **kwargs) -> PosMLPClassifier:
    """Build the ImageNet classifier (e.g. to load a released checkpoint)."""
    return PosMLPClassifier(arch, gate, num_classes=num_classes, **kwargs)
