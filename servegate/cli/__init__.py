"""servegate.cli."""
