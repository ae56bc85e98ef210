"""servegate.model_cards."""
