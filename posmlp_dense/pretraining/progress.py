"""The periodic training log line: loss, learning rate, throughput, ETA."""
from __future__ import annotations

import time
from datetime import timedelta

from timm.utils import AverageMeter


def format_duration(seconds: float) -> str:
    return str(timedelta(seconds=int(max(seconds, 0))))


class Progress:
    """Times the steps of a run and estimates when it ends.

    ``total_steps`` counts the optimizer steps of the whole run and
    ``done_steps`` those finished before this process started (a resumed
    run), so the ETA covers exactly what is left. Throughput counts the
    images of all processes.
    """

    def __init__(self, total_steps: int, done_steps: int,
                 images_per_step: int):
        self.total_steps = total_steps
        self.done = done_steps
        self.images_per_step = images_per_step
        self.step_time = AverageMeter()
        self.data_time = AverageMeter()
        self._last = time.perf_counter()

    def restart_clock(self):
        """Call before the first batch of an epoch (loader start-up and
        evaluation are not training steps)."""
        self._last = time.perf_counter()

    def data_ready(self):
        self.data_time.update(time.perf_counter() - self._last)

    def step_done(self):
        now = time.perf_counter()
        self.step_time.update(now - self._last)
        self._last = now
        self.done += 1

    @property
    def images_per_second(self) -> float:
        return self.images_per_step / max(self.step_time.avg, 1e-9)

    @property
    def eta_seconds(self) -> float:
        return (self.total_steps - self.done) * self.step_time.avg

    def line(self, epoch: int, num_epochs: int, step: int, steps: int,
             loss: AverageMeter, lr: float) -> str:
        width = len(str(steps))
        return (f'epoch {epoch + 1}/{num_epochs} [{step:>{width}}/{steps}] '
                f'loss {loss.val:.4f} ({loss.avg:.4f}) lr {lr:.3e} '
                f'{self.images_per_second:.1f} img/s '
                f'(step {self.step_time.avg:.3f}s, data '
                f'{self.data_time.avg:.3f}s) eta '
                f'{format_duration(self.eta_seconds)}')
