"""The runner layer: build a stage's config and run it, here, in N local processes or on N nodes.

* :mod:`~trainer_lib.runner.stage_api`: a stage's typed config from YAML text and override layers,
  the one text it travels as (:func:`~trainer_lib.runner.stage_api.config_text`), and the start of
  a stage in this process.
* :mod:`~trainer_lib.runner.dispatch`: the one call the components make: run a built config in this
  process, in N local processes (torchrun) or on N nodes, with its checkpoint location.
* :mod:`~trainer_lib.runner.trainjob`: a stage on several nodes as a Kubeflow Trainer ``TrainJob``;
  :mod:`~trainer_lib.runner.kube`: the Kubernetes API connection.
* :mod:`~trainer_lib.runner.outcome`: what a finished stage leaves for its caller to report (the
  model's description, its metrics, its TensorBoard events, the evaluation's gate).

The ``posttrain`` command (``trainer_lib/cli.py``) sits beside this folder, in the same layer.
Nothing is imported here: torch and the ``kubernetes`` client load only when a stage runs.
"""
