"""fingerprint: what identifies the content behind the given locations (never answered from the cache).

``bootstrap`` passes locations (``s3://`` prefixes, hub ids, paths) through by name. Feeding it this
fingerprint makes KFP's cache key of ``bootstrap``, and so of every step after it, change when the
data or model behind a name changes, and stay the same when it does not. The release records the same
fingerprints, and this combination of them, in its lineage (``trainer_lib.release.lineage``).

``check_changes`` compares that fingerprint and the run's parameters with the latest release's, for runs
with ``skip_if_unchanged``; ``record_inputs`` leaves what it compares with beside each release
(``trainer_lib.release.retrain``).
"""

from kfp import dsl
from kfp.dsl import Input, Model

from components.common import image_for


@dsl.component(base_image=image_for("fingerprint"), install_kfp_package=False)
def fingerprint(base_model: str = "", dataset: str = "", preference_dataset: str = "", prompt_dataset: str = "") -> str:
    from trainer_lib import storage
    from trainer_lib.release.lineage import combined_fingerprint

    given = [location for location in (base_model, dataset, preference_dataset, prompt_dataset) if location]
    return combined_fingerprint([(location, storage.fingerprint(location)) for location in given])


@dsl.component(base_image=image_for("check-changes"), install_kfp_package=False)
def check_changes(
    sources_fingerprint: str,
    compared: list,
    release_uri: str = "",
    skip_if_unchanged: bool = False,
    base_model: str = "",
    dataset: str = "",
    preference_dataset: str = "",
    prompt_dataset: str = "",
    rl_algorithm: str = "",
    reward_functions: list = [],
    reward_weights: list = [],
    use_reward_model: bool = False,
    sft_max_steps: int = 0,
    sft_lr: float = 0.0,
    dpo_loss: str = "",
    dpo_beta: float = 0.0,
    dpo_max_steps: int = 0,
    dpo_lr: float = 0.0,
    reward_max_steps: int = 0,
    rl_max_steps: int = 0,
    rl_lr: float = 0.0,
    rollout_n: int = 0,
    max_new_tokens: int = 0,
    batch_size: int = 0,
    max_length: int = 0,
    seed: int = 0,
    gpus_per_step: int = 0,
    nodes_per_step: int = 0,
    gate_rules: list = [],
    served_gate_rules: list = [],
    humaneval_limit: int = 0,
    eval_tasks: str = "",
    eval_safety: str = "",
    deploy_variant: str = "",
    export_overrides: list = [],
    sft_overrides: list = [],
    dpo_overrides: list = [],
    reward_overrides: list = [],
    rl_overrides: list = [],
    evaluate_overrides: list = [],
    demo_overrides: list = [],
    tiny_model_overrides: list = [],
) -> str:
    """Whether the run goes on to train. It stops (returns "") only with ``skip_if_unchanged``, when the
    sources fingerprint and the parameters named in ``compared`` equal the latest release's at ``release_uri``
    (the pipeline's parameters, each passed by name: kfp.local cannot pass lists inside a dict). Otherwise it
    returns those parameters as JSON, what ``record_inputs`` records (a single output: kfp.local cannot
    branch on one of several)."""
    given = dict(locals())
    import json

    from trainer_lib.release.retrain import changes

    parameters = {name: given[name] for name in compared}
    text = json.dumps(parameters, sort_keys=True)
    if not skip_if_unchanged:
        return text
    found = changes(release_uri, sources_fingerprint, parameters)
    if not found:
        print("check changes: nothing changed since the latest release (sources and parameters): not training")
        return ""
    print(f"check changes: training: {'; '.join(found)}")
    return text


@dsl.component(base_image=image_for("record-inputs"), install_kfp_package=False)
def record_inputs(
    released: Input[Model], run_id: str, sources_fingerprint: str, parameters: str, release_uri: str = ""
):
    """Leave ``inputs.json`` beside the release this run published: what ``check_changes`` compares with
    (``parameters``: its output, the compared parameters as JSON)."""
    import json

    from trainer_lib.release.retrain import record

    if not (release_uri and released.metadata.get("released")):
        print("record inputs: nothing was released at a release_uri: nothing to record")
        return
    print(f"record inputs: wrote {record(release_uri, run_id, sources_fingerprint, json.loads(parameters))}")
