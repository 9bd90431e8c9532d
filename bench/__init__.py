"""Benchmarks for respool, run by hand: ``python -m bench wake [--wakes N] [--dsn DSN]``."""
