"""Release bookkeeping: what a gated model is published with, and what a run tells the team.

* :mod:`~trainer_lib.release.lineage`: the lineage record (sources and their fingerprints, configs,
  metrics, the image and commit it was built from).
* :mod:`~trainer_lib.release.model_card`: the model card written beside a release.
* :mod:`~trainer_lib.release.model_registry`: registering a release (MLflow's model registry).
* :mod:`~trainer_lib.release.retrain`: retraining only on change (the inputs a release records, and the
  comparison ``skip_if_unchanged`` makes with them).
* :mod:`~trainer_lib.release.notify`: posting how a pipeline run ended to a webhook.

Nothing is imported here, so ``import trainer_lib.release`` stays cheap.
"""
