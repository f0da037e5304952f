"""Training recipes."""
