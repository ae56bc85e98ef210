"""servegate.capacity."""
