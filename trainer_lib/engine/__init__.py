"""The DeepSpeed engine and what surrounds it."""
