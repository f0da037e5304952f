"""The top-level pipelines, and the registry the CLI compiles, runs and submits.

    posttrain-sft    bootstrap -> sft-stage (prepare -> sft)

Every DAG starts with ``bootstrap``: with ``base_model`` and ``dataset`` left empty it runs
the embedded demo (bundled data, a tiny model trained from scratch); otherwise it passes the
given locations through without copying. To add a pipeline, write it here and list it in
``PIPELINES``; ``posttrain pipeline compile`` then writes ``pipelines/compiled/<name>.yaml``.
"""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Metrics, Model

from components.bootstrap import bootstrap
from pipelines.settings import configure
from pipelines.stages import sft_stage

Outputs = NamedTuple("Outputs", model=Model, metrics=Metrics)


def start(base_model: str, dataset: str, seed: int, demo_sizes: dict, tiny_sizes: dict):
    """The bootstrap task every DAG begins with."""
    return configure(bootstrap(base_model=base_model, dataset=dataset, seed=seed, **demo_sizes, **tiny_sizes),
                     "bootstrap")


@dsl.pipeline(name="posttrain-sft")
def posttrain_sft(
    base_model: str = "",
    dataset: str = "",
    sft_max_steps: int = 200,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    eval_fraction: float = 0.05,
    seed: int = 0,
    sft_config_yaml: str = "",
    sft_overrides: list = [],
    prepare_overrides: list = [],
    demo_code_train: int = 3000,
    demo_code_eval: int = 150,
    demo_safety_train: int = 500,
    demo_safety_eval: int = 100,
    tiny_hidden_size: int = 128,
    tiny_layers: int = 2,
    tiny_vocab_size: int = 1024,
) -> Outputs:
    """Supervised fine-tuning: bootstrap -> prepare -> sft. Empty base_model and dataset run the demo.

    Args:
        base_model: Model to fine-tune: HF hub id, local dir or s3:// prefix. Empty: a tiny demo model.
        dataset: SFT data (messages, prompt/completion or text): file, dir, hub id or s3://. Empty: demo data.
        sft_max_steps: Optimizer steps of SFT.
        lr: Peak learning rate of SFT.
        batch_size: Per-process micro-batch size of SFT.
        max_length: Maximum tokens per example (longer rows are dropped in prepare).
        eval_fraction: Fraction of rows held out for evaluation when the data has no eval split.
        seed: Seed for data generation, splits, initialisation and data order.
        sft_config_yaml: YAML text with any 'posttrain sft' keys; the typed parameters override it.
        sft_overrides: 'key=value' strings for 'posttrain sft', e.g. lora.r=8; they override everything else.
        prepare_overrides: 'key=value' strings for 'posttrain prepare', e.g. max_rows=1000.
        demo_code_train: Demo data: training code tasks.
        demo_code_eval: Demo data: held-out code tasks.
        demo_safety_train: Demo data: training safety rows.
        demo_safety_eval: Demo data: held-out safety prompts.
        tiny_hidden_size: Demo model: hidden size.
        tiny_layers: Demo model: transformer layers.
        tiny_vocab_size: Demo model: BPE vocabulary size.
    """
    boot = start(base_model, dataset, seed,
                 dict(demo_code_train=demo_code_train, demo_code_eval=demo_code_eval,
                      demo_safety_train=demo_safety_train, demo_safety_eval=demo_safety_eval),
                 dict(tiny_hidden_size=tiny_hidden_size, tiny_layers=tiny_layers, tiny_vocab_size=tiny_vocab_size))
    tuned = sft_stage(model=boot.outputs["model"], data=boot.outputs["data"], max_steps=sft_max_steps, lr=lr,
                      batch_size=batch_size, max_length=max_length, eval_fraction=eval_fraction, seed=seed,
                      config_yaml=sft_config_yaml, overrides=sft_overrides, prepare_overrides=prepare_overrides)
    return Outputs(model=tuned.outputs["model"], metrics=tuned.outputs["metrics"])


#: name -> pipeline; the CLI and the compile test iterate over this.
PIPELINES = {p.name: p for p in (posttrain_sft,)}
