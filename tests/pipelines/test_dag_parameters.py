"""Every DAG's parameters are those declared in components/parameters.py, and so is the table in the docs."""

import json
import os

import pytest
from google.protobuf import json_format
from kfp import compiler, dsl

from components.check import check_config
from components.fingerprint import check_changes
from components.parameters import PARAMETERS
from pipelines.dag import COMMON, PIPELINES, Run, declared, fine_tune
from tests.conftest import REPO

IR_TYPES = {str: "STRING", int: "NUMBER_INTEGER", float: "NUMBER_DOUBLE", bool: "BOOLEAN", list: "LIST"}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_dags_compiled_parameters_are_the_declared_ones(name):
    spec = json_format.MessageToDict(PIPELINES[name].pipeline_spec)
    compiled = spec["root"]["inputDefinitions"]["parameters"]
    for parameter, ir in compiled.items():
        declaration = PARAMETERS[parameter]
        assert ir["parameterType"] == IR_TYPES[declaration.type], parameter
        assert ir["defaultValue"] == declaration.default and ir["isOptional"], parameter  # (integers come as floats)
        assert ir["description"] == declaration.doc, parameter  # what the KFP UI shows
    # in the declaration's order, as `posttrain pipeline list` shows them
    assert list(PIPELINES[name].component_spec.inputs) == [p for p in PARAMETERS if p in compiled]


def test_every_declared_parameter_is_some_pipelines_and_the_sft_learning_rate_is_sft_lr_in_all():
    taken = [set(pipeline.component_spec.inputs) for pipeline in PIPELINES.values()]
    assert set().union(*taken) == set(PARAMETERS)
    assert all("sft_lr" in names and "lr" not in names for names in taken)


def test_check_config_and_check_changes_take_every_parameter_any_pipeline_has():
    every = {name: spec for pipeline in PIPELINES.values() for name, spec in pipeline.component_spec.inputs.items()}
    for component, left_out in (
        (check_config, {"notify_webhook", "skip_if_unchanged"}),  # no stage config reads them
        (check_changes, {"notify_webhook"}),  # only the notify task gets the webhook
    ):
        inputs = component.component_spec.inputs
        assert not left_out & set(inputs), component.name
        for name, spec in every.items():
            if name not in left_out:
                assert (inputs[name].type, inputs[name].default) == (spec.type, spec.default), (component.name, name)


def test_a_pipeline_may_take_another_default(tmp_path):
    @dsl.pipeline(name="short-sft")
    @declared("SFT, shorter.", takes=COMMON, defaults={"sft_max_steps": 5})
    def short_sft(run: Run):
        fine_tune(run)

    inputs = short_sft.component_spec.inputs
    assert inputs["sft_max_steps"].default == 5 and inputs["sft_lr"].default == PARAMETERS["sft_lr"].default
    assert short_sft.description == "SFT, shorter."
    compiler.Compiler().compile(short_sft, str(tmp_path / "short.yaml"))  # (a DAG like the others)


def parameter_table() -> str:
    """The table of docs/pipelines.md#parameters, from the declaration and the pipelines that take each."""
    names = ["posttrain-sft", "posttrain-dpo", "posttrain-rlhf", "posttrain-all"]
    assert sorted(names) == sorted(PIPELINES)
    rows = [
        "| parameter | type | default | sft | dpo | rlhf | all | what it does |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, declaration in PARAMETERS.items():
        taken = ["x" if name in PIPELINES[p].component_spec.inputs else "" for p in names]
        default = json.dumps(declaration.default)
        doc = declaration.doc.replace("|", "\\|")
        rows.append(f"| `{name}` | {declaration.type.__name__} | `{default}` | {' | '.join(taken)} | {doc} |")
    return "\n".join(rows) + "\n"


def test_the_docs_table_is_the_declaration():
    with open(os.path.join(REPO, "docs", "pipelines.md"), encoding="utf-8") as fh:
        docs = fh.read()
    table = parameter_table()
    assert table in docs, f"docs/pipelines.md#parameters: replace the table with\n{table}"
