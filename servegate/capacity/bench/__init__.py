"""The bench: workloads, the load generator, what it sends to, run metrics and their intervals, the own server."""
