"""bootstrap: the embedded default, or a pass-through of the user's base model and dataset.

* ``base_model`` empty: train a tokenizer on the bundled demo corpus and save a tiny random
  model into ``model`` (``tiny-model`` stage).
* ``dataset`` empty: the demo's ``sft.jsonl`` becomes ``data``; likewise the demo's preference
  pairs become ``preferences`` and its code-task prompts become ``prompts`` (each a directory
  with ``train.jsonl`` and a held-out ``eval.jsonl``) unless ``preference_dataset`` /
  ``prompt_dataset`` are given.
* Otherwise the given location (HF id, local dir, s3:// prefix) is recorded in the artifact's
  metadata (``source``) and nothing is copied; downstream reads ``source`` or the path.

``demo`` always holds the whole demo dataset directory (preferences, code tasks, safety
prompts) for the stages that evaluate on it.
"""

from kfp import dsl
from kfp.dsl import Dataset, Model, Output

from components.common import image_for


@dsl.component(base_image=image_for("bootstrap"), install_kfp_package=False)
def bootstrap(
    demo: Output[Dataset],
    data: Output[Dataset],
    preferences: Output[Dataset],
    prompts: Output[Dataset],
    model: Output[Model],
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    prompt_dataset: str = "",
    seed: int = 0,
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
    sources_fingerprint: str = "",
):
    """``sources_fingerprint`` (from the ``fingerprint`` step) is not read: as an input it keys the cache.

    ``demo_overrides`` / ``tiny_model_overrides``: ``key=value`` strings for ``posttrain demo-data`` /
    ``posttrain tiny-model`` (sizes of the embedded demo; their defaults live in those stages' configs)."""
    import os
    import shutil

    from components.common import mark_source
    from trainer_lib.runner.stage_api import run_stage

    counts = run_stage("demo-data", [{"seed": seed}, *demo_overrides, {"output_dir": demo.path}])["counts"]
    demo.metadata.update({"kind": "demo", "sft_rows": counts["sft.jsonl"]})

    if dataset:
        mark_source(data, dataset)
    else:  # a directory holding one JSONL file is a dataset the data loader reads as is
        os.makedirs(data.path, exist_ok=True)
        shutil.copy(os.path.join(demo.path, "sft.jsonl"), os.path.join(data.path, "sft.jsonl"))
        data.metadata.update({"kind": "demo", "rows": counts["sft.jsonl"]})

    # split files (train.jsonl / eval.jsonl) keep the demo's held-out rows out of training
    for artifact, given, train, held_out in (
        (preferences, preference_dataset, "preferences.jsonl", "preferences_eval.jsonl"),
        (prompts, prompt_dataset, "rl_prompts.jsonl", "code_tasks_eval.jsonl"),
    ):
        if given:
            mark_source(artifact, given)
            continue
        os.makedirs(artifact.path, exist_ok=True)
        shutil.copy(os.path.join(demo.path, train), os.path.join(artifact.path, "train.jsonl"))
        shutil.copy(os.path.join(demo.path, held_out), os.path.join(artifact.path, "eval.jsonl"))
        artifact.metadata.update({"kind": "demo", "train": counts[train], "eval": counts[held_out]})

    if base_model:
        mark_source(model, base_model)
    else:
        built = run_stage(
            "tiny-model",
            [
                {"seed": seed},
                *tiny_model_overrides,
                {"corpus": os.path.join(demo.path, "corpus.txt"), "output_dir": model.path},
            ],
        )
        model.metadata.update({"kind": "tiny", **{k: built[k] for k in ("hidden_size", "num_layers", "vocab_size")}})
