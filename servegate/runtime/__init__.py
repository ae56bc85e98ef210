"""servegate.runtime."""
