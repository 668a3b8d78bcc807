"""Benchmarks of the bus against the raw transport and against kombu (docs/performance.md).

``python -m bench`` (or ``make bench``) runs every scenario on a fresh Azurite and writes
``bench/results/latest.md``; see docs/performance.md for what each number means.
"""
