"""Where a pipeline's training task keeps its checkpoints: found again by a retry, apart from its output."""

from trainer_lib.config import load_config
from trainer_lib.engine.checkpoint import stable_checkpoint_dir
from trainer_lib.stages.training.sft import SFTConfig


def _cfg(**extra):
    values = {
        "model": {"path": "/runs/r1/bootstrap/model"},
        "data": {"path": "/runs/r1/prepare/prepared"},
        "output_dir": "/runs/r1/train/output_model",
        **extra,
    }
    return load_config(SFTConfig, None, values)


def test_a_retry_finds_the_same_location_whatever_its_output_dir():
    first = stable_checkpoint_dir(_cfg(), "minio://mlpipeline/v2/artifacts", "sft")
    retried = stable_checkpoint_dir(
        _cfg(output_dir="/tmp/another-pod/output_model"), "minio://mlpipeline/v2/artifacts", "sft"
    )
    assert first == retried and first.startswith("s3://mlpipeline/v2/artifacts/checkpoints/sft-")


def test_another_run_or_setting_gets_another_location():
    base = stable_checkpoint_dir(_cfg(), "/root", "sft")
    assert stable_checkpoint_dir(_cfg(data={"path": "/runs/r2/prepare/prepared"}), "/root", "sft") != base
    assert stable_checkpoint_dir(_cfg(lr=3e-4), "/root", "sft") != base
    assert stable_checkpoint_dir(_cfg(), "/root", "dpo").split("/")[-1].startswith("dpo-")
