"""posttrain's library: every stage of LLM post-training, one folder per layer or concern.

Layers, each importing only those below it (``tests/test_layers.py`` checks it; docs/architecture.md)::

    errors.py, values.py     the errors a user fixes; single config values
    losses/                  pure math: preference and policy-gradient losses, advantages
    storage/ data/ config/ models/ engine/ sandbox/ loop/ rewards/ rl/ export/ eval/ serving/ release/ demo/
                             the core, one concern per folder, ranked: each imports only those before it
    stages/training/         the training recipes (sft, reward, dpo, ppo, grpo), each a readable run(config)
    stages/lifecycle/        prepare, evaluate, release, export, deploy
    runner/, cli.py          build a stage's config and run it here, in N processes or on N nodes; ``posttrain``

Nothing is imported here.
"""
