"""AdamW betas/epsilon and every transformers schedule reach the engine; bad ones are refused early."""

import pytest

from trainer_lib.config import METRIC_SCHEDULERS, SCHEDULERS, load_config
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = ["model.path=m", "data.path=d", "output_dir=o"]


def test_scheduler_names_are_transformers_own():
    from transformers.trainer_utils import SchedulerType

    assert set(SCHEDULERS) | set(METRIC_SCHEDULERS) == {s.value for s in SchedulerType}


def test_schedulers_and_adam_settings_in_the_config():
    cfg = load_config(SFTConfig, None, REQUIRED)
    assert (cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon) == (0.9, 0.95, 1e-8)  # our defaults, unchanged
    for name in SCHEDULERS:
        assert load_config(SFTConfig, None, [*REQUIRED, f"lr_scheduler={name}"]).lr_scheduler == name
    with pytest.raises(ConfigError, match="lr_scheduler: reduce_lr_on_plateau steps on an evaluation metric"):
        load_config(SFTConfig, None, [*REQUIRED, "lr_scheduler=reduce_lr_on_plateau"])
    with pytest.raises(ConfigError, match="lr_scheduler: expected one of linear, cosine, .* got 'cosine_decay'"):
        load_config(SFTConfig, None, [*REQUIRED, "lr_scheduler=cosine_decay"])
    with pytest.raises(ConfigError, match="adam_beta2: expected 0 <= x < 1, got 1.0"):
        load_config(SFTConfig, None, [*REQUIRED, "adam_beta2=1"])
    cfg = load_config(
        SFTConfig,
        [{"lr_scheduler_type": "cosine_with_min_lr", "adam_beta2": 0.999, "lr_scheduler_kwargs": {"min_lr_rate": 0.1}}],
        REQUIRED,
    )  # a TRL file
    assert cfg.lr_scheduler_kwargs == {"min_lr_rate": 0.1} and cfg.adam_beta2 == 0.999


@pytest.fixture(scope="module")
def strategy():
    from trainer_lib.config import EngineConfig
    from trainer_lib.engine.strategy import DeepSpeedStrategy

    strategy = DeepSpeedStrategy(EngineConfig(), micro_batch_size=1)
    strategy.setup_distributed()
    return strategy


def _engine(strategy, tiny_model_dir, *overrides):
    from transformers import AutoModelForCausalLM

    cfg = load_config(SFTConfig, None, [*REQUIRED, "lr=1e-3", *overrides])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return strategy.prepare(model, total_steps=10, **cfg.optimizer_args())


def test_the_engine_gets_the_settings(strategy, tiny_model_dir):
    engine = _engine(
        strategy,
        tiny_model_dir,
        "adam_beta1=0.8",
        "adam_beta2=0.999",
        "adam_epsilon=1e-6",
        "lr_scheduler=constant_with_warmup",
        "warmup_steps=4",
    )
    group = engine.optimizer.param_groups[0]
    assert group["betas"] == (0.8, 0.999) and group["eps"] == 1e-6
    assert group["fused"] is True  # one fused AdamW pass per tensor, not torch's per-tensor loop on CPU
    lrs = []
    for _ in range(6):
        lrs.append(engine.lr_scheduler.get_last_lr()[0])
        engine.lr_scheduler.step()
    assert lrs == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])  # warmup, then constant

    engine = _engine(
        strategy, tiny_model_dir, "lr_scheduler=cosine_with_min_lr", 'lr_scheduler_kwargs={"min_lr_rate": 0.1}'
    )
    for _ in range(10):
        engine.lr_scheduler.step()
    assert engine.lr_scheduler.get_last_lr()[0] == pytest.approx(1e-4)  # decays to 10% of the peak
    with pytest.raises(UserError, match="lr_scheduler_kwargs: cosine_with_min_lr cannot start with {}"):
        _engine(strategy, tiny_model_dir, "lr_scheduler=cosine_with_min_lr")
