"""servegate.contracts."""
