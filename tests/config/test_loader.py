"""Config parsing: YAML + overrides, types, clear errors with exit code 2, --help coverage."""

import pytest

from trainer_lib.cli import main
from trainer_lib.config import describe, load_config, parse_overrides
from trainer_lib.errors import ConfigError
from trainer_lib.stages import stage_module
from trainer_lib.stages.training.sft import SFTConfig

REQUIRED = ["model.path=m", "data.path=d.jsonl", "output_dir=out"]


def test_yaml_then_overrides(tmp_path):
    cfg_file = tmp_path / "sft.yaml"
    cfg_file.write_text("max_steps: 7\nlr: 0.01\nengine:\n  zero_stage: 2\nlora:\n  r: 4\n")
    cfg = load_config(
        SFTConfig, str(cfg_file), REQUIRED + ["lr=3e-4", "engine.precision=bf16", "lora.target_modules=q_proj,v_proj"]
    )
    assert cfg.max_steps == 7  # from the file
    assert cfg.lr == pytest.approx(3e-4)  # the override wins
    assert cfg.engine.zero_stage == 2 and cfg.engine.precision == "bf16"
    assert cfg.lora.r == 4 and cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.engine.gradient_accumulation_steps == 1  # untouched default


def test_parse_overrides_nests_and_types():
    assert parse_overrides(["a.b=1", "a.c=true", "d=x,y", "e=0.5"]) == {"a": {"b": 1, "c": True}, "d": "x,y", "e": 0.5}
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_overrides(["novalue"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("engine.zero_stag=2", "engine.zero_stag: unknown key (did you mean 'engine.zero_stage'?)"),
        ("max_steps=ten", "max_steps: expected an integer, got 'ten'"),
        ("engine.zero_stage=5", "engine.zero_stage: expected one of [0, 1, 2, 3], got 5"),
        ("engine.precision=fp8", "engine.precision: expected one of ['fp32', 'bf16'], got 'fp8'"),
        ("batch_size=0", "batch_size: expected a positive number, got 0"),
        ("engine.offload_optimizer=true", "engine.offload_optimizer: needs engine.zero_stage >= 1"),
        ("engine.gradient_checkpointing=maybe", "engine.gradient_checkpointing: expected true or false"),
        ("lr=-1", "lr: expected a positive number"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(SFTConfig, None, REQUIRED + [override])
    assert message in str(err.value)


def test_missing_required_key():
    with pytest.raises(ConfigError, match="output_dir: required"):
        load_config(SFTConfig, None, ["model.path=m", "data.path=d"])


def test_cli_exit_code_2_and_message(capsys, tmp_path):
    assert main(["sft", *REQUIRED, "engine.zero_stag=2"]) == 2
    err = capsys.readouterr().err
    assert "error: engine.zero_stag: unknown key" in err and "Traceback" not in err
    assert main(["sft", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "file not found" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    assert main(["sft", "--config", str(bad)]) == 2
    assert "expected a mapping" in capsys.readouterr().err
    assert main(["nosuchstage"]) == 2


def test_help_lists_every_option(capsys):
    from pipelines.commands import posttrain

    assert main(["--help"]) == 0
    top = capsys.readouterr().out
    assert "sft" in top and "prepare" in top and "pipeline" not in top  # the library knows no pipelines
    assert posttrain(["--help"]) == 0  # the console command adds them
    assert "pipeline" in capsys.readouterr().out
    for stage in ("sft", "prepare"):
        assert main([stage, "--help"]) == 0
        out = capsys.readouterr().out
        module = stage_module(stage)
        for key, _, text in describe(module.CONFIG):
            assert key in out, key
            assert text, f"{stage}: option {key} has no help text"


def test_print_config_round_trips(capsys, tmp_path):
    assert main(["sft", *REQUIRED, "max_steps=3", "--print-config"]) == 0
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(capsys.readouterr().out)
    cfg = load_config(SFTConfig, str(dumped))
    assert cfg.max_steps == 3 and cfg.model.path == "m"


def test_values_given_as_text_parse_like_the_command_line():
    """KFP fills a dict parameter from pipeline parameters as text ('200.0', "['a', 'b']", 'True')."""
    from trainer_lib.stages.training.grpo import GRPOConfig

    cfg = load_config(
        GRPOConfig,
        None,
        {
            "model": {"path": "m"},
            "data": {"path": "d"},
            "output_dir": "o",
            "max_steps": "200.0",
            "lr": "1e-05",
            "resume": "True",
            "reward": {"functions": "['code_execution', 'my.mod:fn']", "weights": "[1.0, 0.5]"},
        },
    )
    assert cfg.max_steps == 200 and cfg.lr == 1e-5 and cfg.resume is True
    assert cfg.reward.functions == ["code_execution", "my.mod:fn"] and cfg.reward.weights == [1.0, 0.5]
    with pytest.raises(ConfigError, match="max_steps: expected an integer"):
        load_config(GRPOConfig, None, {"max_steps": "200.5"})
    with pytest.raises(ConfigError, match="reward.functions: expected a list"):
        load_config(GRPOConfig, None, {"reward": {"functions": "[unclosed"}})


@pytest.mark.parametrize(
    "layers, steps, epochs, line",
    [
        # one layer with both: max_steps > 0 wins, as in transformers
        ([{"num_epochs": 3, "max_steps": 20}], 20, 0.0, "max_steps=20 wins over num_epochs=3"),
        ([{"num_train_epochs": 3.0, "max_steps": -1}], 100, 3.0, None),  # transformers' -1: not set
        # a later layer decides, whichever of the two it gives
        ([{"num_train_epochs": 3.0}, ["max_steps=2"]], 2, 0.0, "max_steps=2 wins over num_epochs=3.0"),
        ([{"max_steps": 50}, ["num_epochs=1"]], 100, 1.0, "num_epochs=1 wins over max_steps=50 (given in a later"),
        ([{"num_epochs": 2}], 100, 2.0, None),
    ],
)
def test_max_steps_wins_over_epochs_and_later_layers_decide(layers, steps, epochs, line, capsys):
    *files, overrides = layers
    cfg = load_config(
        SFTConfig, [{"model": {"path": "m"}, "data": {"path": "d"}, "output_dir": "o"}, *files], overrides
    )
    assert (cfg.max_steps, cfg.num_epochs) == (steps, epochs)
    err = capsys.readouterr().err
    assert (line in err) if line else ("wins over" not in err)


def test_a_component_override_of_epochs_wins_over_its_typed_max_steps():
    from trainer_lib.runner.stage_api import stage_config

    typed = {"max_steps": 100, "lr": 1e-4, "model.path": "m", "data.path": "d", "output_dir": "o"}
    cfg = stage_config("sft", [typed, "num_epochs=1", "learning_rate=5e-5"])  # each a layer of its own
    assert (cfg.num_epochs, cfg.lr) == (1.0, 5e-5)
    cfg = stage_config("sft", [typed], config_yaml="num_epochs: 2\n")  # the typed layer comes after the YAML
    assert (cfg.num_epochs, cfg.max_steps) == (0.0, 100)


def test_a_yaml_alias_bomb_is_one_line_at_once(capsys, tmp_path):
    """Ten lines whose aliases nest 9**9 values deep (a billion laughs) fail as the file is read, in a
    mapping-typed key too, where before the run took minutes and ended in a MemoryError; ordinary anchors
    and aliases still work, and a value that holds itself is refused."""
    rows = ['  a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    rows += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("lr_scheduler_kwargs:\n" + "\n".join(rows) + "\n")
    assert main(["sft", "--config", str(bomb), *REQUIRED]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {bomb}: its YAML aliases expand to more than 100,000 values (an alias bomb?)"
    )
    anchors = tmp_path / "anchors.yaml"
    anchors.write_text("lora:\n  target_modules: &targets [q_proj, v_proj]\nlr_scheduler_kwargs: {names: *targets}\n")
    cfg = load_config(SFTConfig, str(anchors), REQUIRED)
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.lr_scheduler_kwargs == {
        "names": ["q_proj", "v_proj"]
    }
    loop = tmp_path / "loop.yaml"
    loop.write_text("lr_scheduler_kwargs: &kw {again: *kw}\n")
    with pytest.raises(ConfigError, match="a YAML alias refers to a value that holds it"):
        load_config(SFTConfig, str(loop), REQUIRED)


def test_a_key_that_is_a_python_keyword_is_held_by_its_underscored_field(tmp_path):
    """env.class is the field class_: read from YAML and overrides, written back by to_dict (the form a config
    travels in to other processes), flattened, looked up and listed by its key."""
    from trainer_lib.config import flat_dict, lookup, to_dict
    from trainer_lib.stages.training.grpo import GRPOConfig

    cfg_file = tmp_path / "grpo.yaml"
    cfg_file.write_text("env:\n  class: tools\n  tools: [calculator]\n  settings:\n    timeout: 5\n")
    cfg = load_config(GRPOConfig, str(cfg_file), REQUIRED + ["env.settings.max_output_chars=100"])
    assert cfg.env.class_ == "tools" and cfg.env.settings == {"timeout": 5, "max_output_chars": 100}
    assert to_dict(cfg)["env"]["class"] == "tools" and "class_" not in to_dict(cfg)["env"]
    assert load_config(GRPOConfig, to_dict(cfg)) == cfg
    assert flat_dict(cfg)["env.class"] == "tools" and lookup(cfg, "env.class") == "tools"
    assert "env.class" in [key for key, _, _ in describe(GRPOConfig)]
    with pytest.raises(ConfigError, match="env.class_: unknown key"):
        load_config(GRPOConfig, None, REQUIRED + ["env.class_=tools"])
