"""Auto γ: the controller that picks γ (or a token tree, or none) per call, and its decoder."""
