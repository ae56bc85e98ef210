"""servegate.gates."""
