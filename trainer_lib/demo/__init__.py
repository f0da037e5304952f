"""The embedded default."""
