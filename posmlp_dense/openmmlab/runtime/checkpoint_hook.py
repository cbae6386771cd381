"""A CheckpointHook after which a run killed at any moment can resume.

mmengine 0.10's ``CheckpointHook`` leaves two gaps that a kill (SIGKILL, the
OOM killer, a preempted node) can fall into:

* it writes the ``last_checkpoint`` marker that ``--resume`` reads with
  ``open(path, 'w')``, which empties the file before writing it: a kill in
  between leaves an empty marker and ``--resume`` fails;
* with ``max_keep_ckpts`` it removes the oldest checkpoint *before* it writes
  the new one. With ``max_keep_ckpts=1`` that is the checkpoint the marker
  names, and a kill during the write leaves nothing to resume from.

``AtomicCheckpointHook`` writes the marker with one atomic rename, only once
the checkpoint it names is complete, and removes outdated checkpoints only
after that. Checkpoints themselves go through the ``local_atomic`` backend
(the default here for local folders). Configs name it::

    default_hooks = dict(checkpoint=dict(
        type='AtomicCheckpointHook',
        backend_args=dict(backend='local_atomic')))

Registered when ``posmlp_dense.openmmlab.runtime`` is imported.
"""
from __future__ import annotations

import os.path as osp

from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from ... import atomic_io
from .atomic_backend import BACKEND_NAME

MARKER_NAME = 'last_checkpoint'


@HOOKS.register_module()
class AtomicCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook`` (same arguments) with an atomic
    ``last_checkpoint`` marker and removal of outdated checkpoints deferred
    until a newer one is complete and marked.

    Without ``backend_args`` (or ``file_client_args``), checkpoints in a
    local folder are written through the ``local_atomic`` backend.
    """

    def before_train(self, runner) -> None:
        if self.backend_args is None and self.file_client_args is None:
            target = self.out_dir if self.out_dir is not None \
                else runner.work_dir
            if isinstance(get_file_backend(target), LocalBackend):
                self.backend_args = dict(backend=BACKEND_NAME)
        super().before_train(runner)

    @staticmethod
    def write_marker(marker: str, checkpoint: str) -> None:
        """Point ``marker`` at ``checkpoint`` in one atomic rename."""
        atomic_io.atomic_write_bytes(checkpoint.encode('utf-8'), marker)

    def _save_checkpoint_with_step(self, runner, step, meta):
        # The same steps as mmengine's, in a safe order: bookkeeping, write
        # the checkpoint, mark it, and only then remove outdated ones.
        outdated = []
        if self.max_keep_ckpts > 0 and not (
                self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
            # (the same step again: a re-save after a new best checkpoint)
            kept = [*self.keep_ckpt_ids, step]
            outdated = kept[:-self.max_keep_ckpts]
            self.keep_ckpt_ids.append(step)  # the deque drops `outdated`
            # The checkpoint written now still lists the outdated ones: a
            # run resumed after a kill before they were removed removes them
            # (CheckpointHook.before_train trims the list it resumes with).
            runner.message_hub.update_info('keep_ckpt_ids', kept)

        self.last_ckpt = self.file_backend.join_path(
            self.out_dir, self.filename_tmpl.format(step))
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        runner.save_checkpoint(
            self.out_dir,
            self.filename_tmpl.format(step),
            self.file_client_args,
            save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler,
            meta=meta,
            by_epoch=self.by_epoch,
            backend_args=self.backend_args,
            **self.args)
        if self.max_keep_ckpts > 0:
            runner.message_hub.update_info('keep_ckpt_ids',
                                           list(self.keep_ckpt_ids))

        # only the main process marks and removes, as in mmengine
        if not is_main_process():
            return
        self.write_marker(osp.join(runner.work_dir, MARKER_NAME),
                          self.last_ckpt)
        for old_step in outdated:
            path = self.file_backend.join_path(
                self.out_dir, self.filename_tmpl.format(old_step))
            if path == self.last_ckpt:
                continue
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):  # DeepSpeed checkpoints
                self.file_backend.rmtree(path)


__all__ = ['AtomicCheckpointHook', 'MARKER_NAME']
