"""`gate plan`: the search over batching policies under the targets and the memory budget, and its report."""
