"""check config: the first task of every DAG; checks every stage config this run will build.

``posttrain pipeline run|submit|schedule`` check the configs on the laptop before anything starts. A
run started from the Kubeflow UI, a recurring run or ``kfp run create`` never passes through that
code, so the DAG checks itself: this task reads the run's IR and parameters back from the KFP API and
fails in seconds, naming the task, stage and key, before any pod trains for hours on a typo.

The API is read from ``$POSTTRAIN_KFP_API`` (the ``posttrain-config`` ConfigMap sets it on the
cluster); without it (``kfp.local``, where the CLI already checked) the task only says so.
"""

from kfp import dsl

from components.common import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def check_config(run_id: str) -> int:
    import os
    import sys

    from components.validation import ValidationError, check_run

    host = os.environ.get("POSTTRAIN_KFP_API", "")
    if not host:
        print(
            "POSTTRAIN_KFP_API is not set: the stage configs are not checked here "
            "(posttrain pipeline run/submit/schedule checked them before the run started)"
        )
        return 0
    try:
        checked = check_run(run_id, host)
    except (ValidationError, RuntimeError) as exc:
        sys.exit(f"check config: {exc}")
    print(f"run {run_id}: all {checked} stage configs are valid")
    return checked
