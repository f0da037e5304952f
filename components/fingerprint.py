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
from components.parameters import with_parameters


@dsl.component(base_image=image_for("fingerprint"), install_kfp_package=False)
def fingerprint(base_model: str = "", dataset: str = "", preference_dataset: str = "", prompt_dataset: str = "") -> str:
    from trainer_lib import storage
    from trainer_lib.release.lineage import combined_fingerprint

    given = [location for location in (base_model, dataset, preference_dataset, prompt_dataset) if location]
    return combined_fingerprint([(location, storage.fingerprint(location)) for location in given])


@dsl.component(base_image=image_for("check-changes"), install_kfp_package=False)
@with_parameters(leaving_out=("notify_webhook",))  # (only the notify task gets the webhook)
def check_changes(
    sources_fingerprint: str, compared: list, release_uri: str = "", skip_if_unchanged: bool = False, **parameters
) -> str:
    """Whether the run goes on to train. It stops (returns "") only with ``skip_if_unchanged``, when the
    sources fingerprint and the parameters named in ``compared`` equal the latest release's at ``release_uri``
    (every pipeline parameter is an input, each by name: kfp.local cannot pass lists inside a dict; the DAG
    passes those it compares). Otherwise it returns those parameters as JSON, what ``record_inputs`` records
    (a single output: kfp.local cannot branch on one of several)."""
    import json

    from trainer_lib.release.retrain import changes

    compared_values = {name: parameters[name] for name in compared}
    text = json.dumps(compared_values, sort_keys=True)
    if not skip_if_unchanged:
        return text
    found = changes(release_uri, sources_fingerprint, compared_values)
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
