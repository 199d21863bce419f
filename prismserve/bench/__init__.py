"""Benchmarking: workloads from public traces, an open-loop load generator, metrics and plots.

Talks to a gateway over HTTP only, so it measures what a client sees.
"""

# The trace workloads by name (`bench.workloads.trace`); here, so that the CLI lists them without numpy.
TRACES = ("any2any", "servegen", "azure-conv", "azure-code", "mooncake-conversation", "mooncake-synthetic")
