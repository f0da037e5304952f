"""notify: the exit task of every DAG; posts how the run ended to a webhook (``trainer_lib.release.notify``).

It runs after all other tasks, whether they succeeded or not (``dsl.ExitHandler``), and KFP hands it the
final status of the run's tasks. ``webhook`` is the run's ``notify_webhook`` parameter, else
``$POSTTRAIN_NOTIFY_WEBHOOK`` (the optional ``posttrain-notify`` Secret, so the URL and its token need not be
a run parameter anyone with the KFP UI can read); neither: the outcome is only printed. A webhook that is
down, refuses or hangs never fails this task, so it never fails the run.
"""

from kfp import dsl

from components.common import image_for


@dsl.component(base_image=image_for("notify"), install_kfp_package=False)
def notify(
    status: dsl.PipelineTaskFinalStatus,
    webhook: str = "",
    pipeline: str = "",
    run_id: str = "",
    run_name: str = "",
    pipeline_root: str = "",
    release_uri: str = "",
    timeout_s: float = 5.0,
    tries: int = 3,
):
    """``status``: KFP's; ``run_id``, ``run_name``, ``pipeline_root``: KFP's placeholders, from which the
    run's artifacts are found (``{root}/{run_name}`` under kfp.local, ``{root}/{pipeline}/{run_id}`` on KFP)."""
    import os

    from trainer_lib import storage
    from trainer_lib.release.notify import notify as send

    final = {"state": status.state, "error_message": status.error_message}
    run = {"pipeline": pipeline, "run_id": run_id, "run_name": run_name}
    dirs = (
        [storage.join(pipeline_root, run_name), storage.join(pipeline_root, pipeline, run_id)] if pipeline_root else []
    )
    hook = webhook or os.environ.get("POSTTRAIN_NOTIFY_WEBHOOK", "")
    try:
        send(
            hook,
            final,
            run,
            release_uri=release_uri,
            run_dirs=dirs,
            timeout_s=timeout_s,
            tries=tries,
        )
    except Exception as exc:  # a notification never fails the run
        why = storage.redact(str(exc).replace(hook, "<webhook>") if hook else str(exc))[:300]
        print(f"notify: warning: no notification ({type(exc).__name__}: {why})")
