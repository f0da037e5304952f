"""The search option of the DAGs: with ``dpo_search`` (``sft_search`` in posttrain-sft) a ``tune`` task runs
before the stage and hands it its best config; without it the run takes the branch it always took."""

import json
import re

import pytest
from google.protobuf import json_format

from pipelines.commands import UsageError, parse_params
from pipelines.dag import PIPELINES
from pipelines.validate import ValidationError, validate

SEARCH = """
overrides: {max_steps: 20, eval_steps: 5}
space:
  lr: {low: 1.0e-6, high: 1.0e-4, log: true}
  beta: {low: 0.02, high: 0.5}
objective: {metric: logps/accuracy}
n_trials: 4
"""
#: the stage each pipeline's search option tunes: (its parameter, the training task's name)
TUNED = {
    "posttrain-dpo": ("dpo_search", "DPO"),
    "posttrain-all": ("dpo_search", "DPO"),
    "posttrain-sft": ("sft_search", "SFT"),
}
_CHANNEL = re.compile(r"inputs\.parameter_values\['pipelinechannel--(\w+)'\]")


def ir(name: str) -> dict:
    return json_format.MessageToDict(PIPELINES[name].pipeline_spec)


def holds(condition: str, params: dict) -> bool:
    """A branch's condition on the run's parameters (one on a task's output, check changes', is taken)."""
    text = _CHANNEL.sub(lambda m: json.dumps(params[m.group(1)]), condition)
    if "inputs.parameter_values[" in text:
        return True
    text = text.replace("!(", "not (").replace("&&", " and ")
    return bool(eval(text, {"__builtins__": {}}, {"true": True, "false": False}))


def tasks_run(spec: dict, params: dict) -> list[tuple[str, dict]]:
    """(component, task) of every task the run would start with ``params`` (the declared defaults beneath)."""
    defaults = {k: d.get("defaultValue") for k, d in spec["root"]["inputDefinitions"]["parameters"].items()}
    values, found = {**defaults, **params}, []

    def walk(dag: dict) -> None:
        for task in dag["tasks"].values():
            condition = task.get("triggerPolicy", {}).get("condition")
            if condition and not holds(condition, values):
                continue
            component = spec["components"][task["componentRef"]["name"]]
            if "dag" in component:
                walk(component["dag"])
            else:
                found.append((re.sub(r"-\d+$", "", task["componentRef"]["name"].removeprefix("comp-")), task))

    walk(spec["root"]["dag"])
    return found


@pytest.mark.parametrize("name", sorted(TUNED))
def test_with_a_search_the_tune_task_runs_before_the_stage_and_hands_it_the_best_config(name):
    parameter, title = TUNED[name]
    spec = ir(name)
    searched = tasks_run(spec, {parameter: json.dumps({"space": {}})})
    (tuning,) = [task for component, task in searched if component == "tune"]
    (trained,) = [task for component, task in searched if task["taskInfo"]["name"] == title]
    tune_name = _name(spec, tuning)
    assert tuning["taskInfo"]["name"] == f"tune {title}"
    assert tune_name in trained["dependentTasks"]
    assert trained["inputs"]["artifacts"]["tuned"] == {
        "taskOutputArtifact": {"producerTask": tune_name, "outputArtifactKey": "best_config"}
    }
    # the search trains on the task's own model, prepared data and settings
    assert tuning["inputs"]["artifacts"]["data"] == trained["inputs"]["artifacts"]["data"]
    assert tuning["inputs"]["artifacts"]["model"] == trained["inputs"]["artifacts"]["model"]
    given = tuning["inputs"]["parameters"]
    assert given["search"] == {"componentInputParameter": f"pipelinechannel--{parameter}"}
    for key in ("stage", "max_steps", "lr", "overrides", "seed"):
        assert given[key] == trained["inputs"]["parameters"][key], key

    plain = tasks_run(spec, {})  # the default: no search
    assert not [task for component, task in plain if component == "tune"]
    (trained,) = [task for component, task in plain if task["taskInfo"]["name"] == title]
    assert "tuned" not in trained["inputs"]["artifacts"]
    # the same DAG as before otherwise: a run with a search starts exactly one task more
    assert sorted(c for c, _ in searched) == sorted([*(c for c, _ in plain), "tune"])


def test_the_rlhf_pipeline_has_no_search():
    assert "dpo_search" not in PIPELINES["posttrain-rlhf"].component_spec.inputs
    assert not [c for c, _ in tasks_run(ir("posttrain-rlhf"), {}) if c == "tune"]


def test_the_cli_passes_a_search_on_as_one_line_and_checks_it_before_the_run():
    pipeline = PIPELINES["posttrain-dpo"]
    params = parse_params(pipeline, ["dpo_search=" + SEARCH + "study_name: it's\n"])
    text = params["dpo_search"]
    assert "\n" not in text and "'" not in text and json.loads(text)["study_name"] == "it's"
    assert validate(pipeline, params) == validate(pipeline, {}) + 1  # the search is checked too
    with pytest.raises(ValidationError, match=r"task 'tune DPO' \(posttrain tune, dpo\): space.betta: the stage"):
        validate(pipeline, parse_params(pipeline, ["dpo_search=" + SEARCH.replace("beta:", "betta:")]))
    with pytest.raises(UsageError, match="dpo_search: invalid YAML or JSON"):
        parse_params(pipeline, ["dpo_search=space: {lr: [1"])
    assert parse_params(pipeline, ["dpo_search= "]) == {"dpo_search": ""}


def _dags(spec: dict):
    yield "root", spec["root"]["dag"]["tasks"]
    for key, component in spec["components"].items():
        if "dag" in component:
            yield key, component["dag"]["tasks"]


def _name(spec: dict, wanted: dict) -> str:
    """The key of task ``wanted`` in the DAG that holds it (what other tasks name it by)."""
    return next(key for _, tasks in _dags(spec) for key, task in tasks.items() if task is wanted)
