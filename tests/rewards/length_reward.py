"""A custom reward function as users write them (TRL's signature), used by the RL stage tests."""

TARGET = 8  # characters


def reward(prompts, completions, **columns):
    """0 at exactly TARGET characters, minus 1 for every TARGET characters away from it."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [-abs(len(text) - TARGET) / TARGET for text in texts]
