"""servegate.zoo."""
