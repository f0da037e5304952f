"""The tune component: a search of a few real DPO trials on a tiny model, run by the component's body called
directly; the best config it writes is the training task's config with the best trial's values, and the
train component trains with it."""

import json

import pytest
import yaml
from kfp import dsl

from components.common import CUDA_IMAGE
from components.train import train
from components.tune import tune
from trainer_lib.errors import ConfigError
from trainer_lib.runner.tune.pipeline_search import pipeline_search

PAIRS = [
    {"prompt": f"Tell me about {w}:", "chosen": f" {w} is kind.", "rejected": f" {w} is rude."}
    for w in "apple river stone cloud lamp green table seven".split()
]
#: three short trials over DPO's learning rate, ranked by the held-out loss (which lr leaves in scale)
SEARCH = """
overrides: {max_steps: 2, eval_steps: 1}     # the trials only
space:
  lr: {low: 1.0e-4, high: 1.0e-1, log: true}
objective: {metric: eval_loss, direction: minimize}
n_trials: 3
pruner: {kind: none}
heartbeat_s: 2
"""


def test_interface():
    spec = tune.component_spec
    assert spec.implementation.container.image == CUDA_IMAGE  # its trials train, as the training task does
    assert {name: s.type for name, s in spec.outputs.items()} == {
        "best_config": "system.Artifact@0.0.1",
        "results": "system.Artifact@0.0.1",
        "report": "system.HTML@0.0.1",
        "metrics": "system.Metrics@0.0.1",
    }
    # it takes what the train component takes to build the stage's config, and the search file as text
    shared = {"stage", "model", "data", "max_steps", "lr", "batch_size", "max_length", "seed", "params"}
    assert shared | {"config_yaml", "overrides"} <= set(spec.inputs) <= set(train.component_spec.inputs) | {"search"}
    assert spec.inputs["search"].type == "String" and train.component_spec.inputs["tuned"].optional


def test_a_search_in_the_task_hands_the_best_trials_values_to_the_training_task(tiny_model_dir, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in PAIRS))
    model = dsl.Model(uri=str(tiny_model_dir))
    pairs = dsl.Dataset(uri=str(data))
    common = dict(stage="dpo", model=model, data=pairs, max_steps=3, lr=5e-5, batch_size=4, max_length=64)
    common.update(params={"loss": "ipo"}, config_yaml="save_steps: 0\n", overrides=["data.eval_fraction=0.25"])
    best_config = dsl.Artifact(uri=str(tmp_path / "best.yaml"))
    results, report = dsl.Artifact(uri=str(tmp_path / "results.json")), dsl.HTML(uri=str(tmp_path / "report.html"))
    metrics = dsl.Metrics(uri=str(tmp_path / "metrics"))
    tune.python_func(search=SEARCH, best_config=best_config, results=results, report=report, metrics=metrics, **common)

    found = json.loads((tmp_path / "results.json").read_text())
    complete = [row for row in found["trials"] if row["state"] == "complete"]
    assert len(found["trials"]) == 3 and len(complete) >= 2
    best = min(complete, key=lambda row: row["value"])
    assert found["best"]["trial"] == best["number"] and found["best"]["value"] == best["value"]
    # best.yaml: the training task's own config (its 3 steps, its loss and overrides) with the best trial's lr
    # and seed; the search's overrides (2 steps, an eval every step) were for the trials only
    chosen = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert chosen["lr"] == best["params"]["lr"] and chosen["seed"] == best["seed"] == 0
    assert chosen["max_steps"] == 3 and chosen["loss"] == "ipo" and chosen["data"]["eval_fraction"] == 0.25
    assert chosen["eval_steps"] != 1 and chosen["save_steps"] == 0
    assert "trial " + str(best["number"]) in (tmp_path / "best.yaml").read_text().splitlines()[0]
    assert "Parameter importances" in (tmp_path / "report.html").read_text()
    assert metrics.metadata["best.eval_loss"] == best["value"] and metrics.metadata["best.lr"] == best["params"]["lr"]
    assert metrics.metadata["trials.complete"] == len(complete)
    assert best_config.metadata["trial"] == best["number"] and best_config.metadata["metric"] == "eval_loss"

    # the train component given that artifact trains with it, whatever its own typed lr says
    policy = dsl.Model(uri=str(tmp_path / "dpo"))
    train.python_func(
        output_model=policy,
        metrics=dsl.Metrics(uri=str(tmp_path / "dpo_metrics")),
        tensorboard=dsl.Artifact(uri=str(tmp_path / "dpo_tb")),
        tuned=best_config,
        **{**common, "lr": 0.5},
    )
    trained = json.loads((tmp_path / "dpo" / "lineage.json").read_text())["stages"][-1]["config"]
    assert trained["lr"] == best["params"]["lr"] and trained["max_steps"] == 3
    assert trained["output_dir"] == str(tmp_path / "dpo") and trained["model.path"] == str(tiny_model_dir)


@pytest.mark.parametrize(
    ("search", "expected"),
    [
        ("stage: sft\n" + SEARCH, "stage: this search runs before the dpo task"),
        ("config: [dpo.yaml]\n" + SEARCH, "config: not taken by the pipeline's search"),
        ("storage: sqlite:///study.db\n" + SEARCH, "storage: not taken"),
        (SEARCH.replace("{max_steps: 2,", "{data.path: x.jsonl, max_steps: 2,"), "overrides.data.path: the pipeline"),
        ("[lr, beta]", "search: expected a search file"),
        (SEARCH.replace("eval_loss", "logps/accuracy").replace("lr:", "beta:"), None),  # a fine one
    ],
)
def test_what_only_a_pipelines_search_refuses(search, expected):
    layers = [{"max_steps": 3}, {"model.path": "/m", "data.path": "/d"}]
    if expected is None:
        assert pipeline_search("dpo", search, layers, "", "/tmp/tune").tune.output_dir == "/tmp/tune"
        return
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(")):
        pipeline_search("dpo", search, layers, "", "/tmp/tune")
