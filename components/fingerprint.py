"""fingerprint: what identifies the content behind the given locations (never answered from the cache).

``bootstrap`` passes locations (``s3://`` prefixes, hub ids, paths) through by name. Feeding it this
fingerprint makes KFP's cache key of ``bootstrap``, and so of every step after it, change when the
data or model behind a name changes, and stay the same when it does not. The release records the same
fingerprints, and this combination of them, in its lineage (``trainer_lib.eval.lineage``).
"""

from kfp import dsl

from components.common import image_for


@dsl.component(base_image=image_for("fingerprint"), install_kfp_package=False)
def fingerprint(base_model: str = "", dataset: str = "", preference_dataset: str = "", prompt_dataset: str = "") -> str:
    from trainer_lib import storage
    from trainer_lib.eval.lineage import combined_fingerprint

    given = [location for location in (base_model, dataset, preference_dataset, prompt_dataset) if location]
    return combined_fingerprint([(location, storage.fingerprint(location)) for location in given])
