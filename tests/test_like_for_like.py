"""The performance page's CPU table of PosMLP-T against Swin-T
(``benchmarks.tables.cpu_vs_swin_section``), from a report's rows."""
from __future__ import annotations

import pytest

from benchmarks.tables import cpu_vs_swin_section


def inference_row(model, times, peak):
    return dict(model=model, size=[800, 1333], batch=1, mode='fwd',
                times=times, median_s=sorted(times)[1], min_s=min(times),
                peak_mem_mb=peak)


def training_row(model, times, peak=None):
    return dict(kind='backbone', model=model, shape=[2, 512, 512],
                with_cp=False, times=times, median_s=sorted(times)[1],
                min_s=min(times), peak_mb=peak)


def run_report(load=0.5, results=None, training=None) -> dict:
    return dict(
        environment=dict(git_commit='0123456789abcdef', git_dirty_files=[],
                         time='2026-12-04T16:40:00', torch='2.14.1',
                         cpu_model='AMD EPYC', threads=2, cpu_count=2,
                         device='cpu', loadavg_start=[load, 0, 0],
                         loadavg_end=[load, 0, 0]),
        results=results if results is not None else [
            inference_row('posmlp_t', [0.9, 1.2, 1.5], 600.0),
            inference_row('swin_t', [1.0, 1.0, 1.5], 500.0)],
        training=training if training is not None else [
            training_row('posmlp_t', [2.0, 8.0, 9.0]),
            training_row('swin_t', [1.0, 10.0, 10.0])])


def test_a_row_per_step_with_both_times_and_the_ratios():
    lines = cpu_vs_swin_section(run_report()).splitlines()
    assert lines[0].startswith('At commit 0123456, 2026-12-04T16:40:00, '
                               'torch 2.14.1 on AMD EPYC (2 threads, fp32)')
    # medians 1.2 / 1.0; fastest 0.9 / 1.0; rounds 0.9, 1.2, 1.0
    assert ('| inference 1x3x800x1333 | 1.200 s | 1.000 s | 1.20 (0.90; '
            'paired 1.00, rounds 0.90-1.20) | 1.20 |') in lines
    # medians 8 / 10; fastest 2 / 1; rounds 2.0, 0.8, 0.9
    assert ('| training 2x3x512x512 | 8.000 s | 10.000 s | 0.80 (2.00; '
            'paired 0.90, rounds 0.80-2.00) | - |') in lines
    assert 'busy' not in '\n'.join(lines)


def test_a_busy_machine_is_said_and_a_run_without_swin_has_no_table():
    assert '**The machine was busy during this run**' in \
        cpu_vs_swin_section(run_report(load=6.0))
    alone = run_report(results=[inference_row('posmlp_t', [1.0] * 3, 1.0)],
                       training=[training_row('posmlp_t', [1.0] * 3)])
    assert cpu_vs_swin_section(alone) == ''


@pytest.mark.parametrize('seconds, text', [(0.5, '500 ms'),
                                           (1.5, '1.500 s')])
def test_times_below_a_second_in_milliseconds(seconds, text):
    section = cpu_vs_swin_section(run_report(results=[
        inference_row('posmlp_t', [seconds] * 3, None),
        inference_row('swin_t', [seconds] * 3, None)], training=[]))
    assert f'| inference 1x3x800x1333 | {text} | {text} |' in section
