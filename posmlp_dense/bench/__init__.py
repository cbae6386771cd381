"""Benchmark instruments behind ``tools/benchmark.py``.

Not imported by ``posmlp_dense`` itself: the model needs none of it.
``measure`` holds the instruments (timing, peak memory, MACs, calibration),
``models`` builds the compared backbones, ``published_port`` the published
computation used as a speed baseline, ``report`` the tables and chart.
"""
