"""Quality statistics shared by the gates: paired non-inferiority, boundaries, next-token divergence, the
output-length guard and the paired comparison of two manifests on the same suite items."""
