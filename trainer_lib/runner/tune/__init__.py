"""A local hyperparameter search over a stage's keys with Optuna: ``posttrain tune --config tune.yaml``.

* :mod:`~trainer_lib.runner.tune.search_config`: the search file (stage, base config, search space,
  objective, budget), and every check made before the first trial.
* :mod:`~trainer_lib.runner.tune.trial_process`: one trial as a ``posttrain <stage>`` process in a
  process group of its own, its eval records followed as they are written;
  :mod:`~trainer_lib.runner.tune.trial_reaper`: the process that kills the trials a dead search leaves.
* :mod:`~trainer_lib.runner.tune.optuna_study`: the study in Optuna's RDB storage, with heartbeats, the
  resume of a killed search, the trials run in parallel.
* :mod:`~trainer_lib.runner.tune.tune_results`: the table of trials, the best config as a stage YAML,
  ``report.html``.
* :mod:`~trainer_lib.runner.tune.tune_cli`: the command.
* :mod:`~trainer_lib.runner.tune.pipeline_search`: the same search run by a pipeline's ``tune`` task,
  on the config of the training task it comes before, which it hands the best config.

It sits in the runner layer: it builds stage configs and runs stages, as the rest of ``runner/`` does.
Optuna is imported only when a search runs (the ``tune`` extra).
"""
