"""Adapters: the I/O edges (Redis usage store, NATS helpers, clocks) around the pure core.

Nothing here opens a connection at import time; clients are created by the caller (a
service's lifespan, a test fixture) and injected.
"""
