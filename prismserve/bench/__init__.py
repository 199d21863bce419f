"""Benchmarking: workloads from public traces, an open-loop load generator, metrics and plots.

Talks to a gateway over HTTP only, so it measures what a client sees.
"""
