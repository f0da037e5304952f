"""The pipeline parameters' declaration, and the component signatures written from it."""

import inspect

import pytest
from kfp import dsl

from components.check import check_config
from components.fingerprint import check_changes
from components.parameters import PARAMETERS, pipeline_docstring, pipeline_signature, with_parameters


def test_a_pipeline_signature_takes_the_declared_parameters_in_their_order_with_their_defaults():
    signature = pipeline_signature(["seed", "base_model", "sft_lr"], defaults={"seed": 7})
    assert list(signature.parameters) == ["base_model", "sft_lr", "seed"]  # (the declaration's order)
    assert [(p.annotation, p.default) for p in signature.parameters.values()] == [(str, ""), (float, 1e-4), (int, 7)]
    assert PARAMETERS["seed"].default == 0  # an override is the pipeline's own
    with pytest.raises(KeyError, match="not declared in components/parameters.py: lr"):
        pipeline_signature(["lr"])
    with pytest.raises(KeyError, match="dpo_lr \\(a default for a parameter not taken\\)"):
        pipeline_signature(["seed"], defaults={"dpo_lr": 1.0})
    assert pipeline_docstring("Summary.", ["seed"]) == f"Summary.\n\nArgs:\n    seed: {PARAMETERS['seed'].doc}"


def test_every_declared_parameter_has_a_kfp_type_a_default_of_it_and_a_doc():
    for name, declared in PARAMETERS.items():
        assert declared.type in (str, int, float, bool, list), name
        assert type(declared.default) is declared.type, name
        assert declared.doc.endswith(".") and "\n" not in declared.doc, name


def spelled_out(run_id: str, flag: bool = False, **parameters) -> dict:
    """A component body: what it was given."""
    # (a comment the written source keeps)
    return {"run_id": run_id, "flag": flag, **parameters}


def test_with_parameters_writes_a_real_signature_and_binds_the_rest():
    written = with_parameters(leaving_out=("notify_webhook",))(spelled_out)
    taken = [name for name in PARAMETERS if name != "notify_webhook"]
    assert list(inspect.signature(written).parameters) == ["run_id", "flag", *taken]
    source = inspect.getsource(written)  # what KFP embeds in the IR and its executor reads the inputs from
    assert source.startswith("def spelled_out(\n    run_id: str,\n    flag: bool = False,\n    base_model: str = '',\n")
    assert "    reward_functions: list = ['code_execution'],\n" in source and "notify_webhook" not in source
    assert '"""A component body: what it was given."""' in source and "# (a comment the written source keeps)" in source
    assert inspect.getfullargspec(written).annotations["sft_lr"] is float
    given = written("r1", seed=3)
    assert given == {"run_id": "r1", "flag": False, **{n: PARAMETERS[n].default for n in taken}, "seed": 3}


def test_the_components_embed_the_written_source():
    for component, own in ((check_config, ("run_id", "compiled_spec")), (check_changes, ("sources_fingerprint",))):
        embedded = component.component_spec.implementation.container.command[-1]
        assert inspect.getsource(component.python_func) in embedded
        assert f"def {component.python_func.__name__}(\n    {own[0]}: str,\n" in embedded


@pytest.fixture
def kfp_local(tmp_path):
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    yield
    local.config.LocalExecutionConfig.instance = None


@pytest.mark.filterwarnings("ignore:You may be attemping to run a task that uses custom")
def test_kfp_local_runs_the_written_source_with_list_parameters_by_name(kfp_local):
    """The reason for spelling the parameters out: kfp.local passes each by name, lists too (a dict of them
    it cannot fill)."""

    @dsl.pipeline
    def compare(dpo_overrides: list = ["beta=0.2"], seed: int = 3) -> str:  # noqa: B006 (a KFP default)
        return check_changes(
            sources_fingerprint="f", compared=["dpo_overrides", "seed"], dpo_overrides=dpo_overrides, seed=seed
        ).output

    assert compare().output == '{"dpo_overrides": ["beta=0.2"], "seed": 3}'
