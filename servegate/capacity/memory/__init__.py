"""Memory side of capacity: weight bytes from a model config, and the budget split into weights, runtime and KV."""
