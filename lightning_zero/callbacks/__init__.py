"""Callbacks for fitting ZeRO runs: throughput monitoring and a batch-size finder that works under ZeRO."""
