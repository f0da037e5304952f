"""dpo: SFT model + prepared preference data -> preference-optimized model (HF format) and its metrics."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from components.common import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def dpo(
    model: Input[Model],
    data: Input[Dataset],
    output_model: Output[Model],
    metrics: Output[Metrics],
    loss: str = "sigmoid",
    beta: float = 0.1,
    max_steps: int = 100,
    lr: float = 1e-4,
    batch_size: int = 8,
    max_length: int = 512,
    seed: int = 0,
    config_yaml: str = "",
    overrides: list = [],
):
    """Precedence, lowest first: config_yaml, the typed parameters, overrides, the artifacts.

    Precomputed reference log-probs (``reference=precomputed``) are cached next to the dataset when
    it lives in the object store, so a retry, a resumed run or another DPO run on the same data and
    reference model finds them there.
    """
    from components.common import last_logged, log_summary, source_of
    from trainer_lib.stage_api import run_stage

    params = {"loss": loss, "beta": beta, "max_steps": max_steps, "lr": lr, "batch_size": batch_size,
              "data.max_length": max_length, "seed": seed}
    wiring = {"model.path": source_of(model), "data.path": source_of(data), "output_dir": output_model.path}
    # KFP's MinIO store is S3-compatible (minio://bucket/key == s3://bucket/key at the same endpoint)
    uris = [u.replace("minio://", "s3://", 1) for u in (source_of(data), data.uri) if u]
    store = next((u.rstrip("/") for u in uris if u.startswith("s3://")), None)
    if store and "." in store.rsplit("/", 1)[-1]:  # a data file: cache next to it
        store = store.rsplit("/", 1)[0]
    cache = {"reference_logps_path": store + "/reference_logps"} if store else {}
    summary = run_stage("dpo", [params, cache, *overrides, wiring], config_yaml)
    output_model.metadata.update({"stage": "dpo", "loss": loss, "steps": summary.get("steps"),
                                  "base": source_of(model)})
    log_summary(metrics, {**summary, "train": last_logged(output_model.path, "train")})
