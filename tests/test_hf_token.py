"""HF_TOKEN: hub clients read it from the environment; nothing posttrain prints, writes or logs holds it."""

import os

import pytest

from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError
from trainer_lib.stages.training.sft import SFTConfig

CANARY = "hf_posttrainCanaryToken0123456789abcdXYZ"


def _files(root):
    for folder, _, names in os.walk(root):
        for name in names:
            yield os.path.join(folder, name)


def test_the_token_reaches_hub_clients_and_nothing_we_write(monkeypatch, tiny_model_dir, chat_jsonl, tmp_path, capsys):
    from huggingface_hub import get_token

    monkeypatch.setenv("HF_TOKEN", CANARY)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    out = tmp_path / "sft"
    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        f"output_dir={out}",
        "max_steps=2",
        "batch_size=2",
        "data.max_length=64",
        "save_steps=1",
        "logging_steps=1",
        "report_to=tensorboard,mlflow",
        "learning_rate=1e-3",
    ]
    assert main(args) == 0
    assert main([*args, "--print-config"]) == 0
    assert os.environ["HF_TOKEN"] == CANARY and get_token() == CANARY  # not clobbered: the hub clients see it
    printed = capsys.readouterr()
    assert CANARY not in printed.out + printed.err
    written = [*_files(out), str(tmp_path / "mlflow.db")]
    assert any(f.endswith("summary.json") for f in written) and any("tfevents" in f for f in written)
    leaked = [f for f in written if CANARY.encode() in open(f, "rb").read()]
    assert not leaked  # model, tokenizer, checkpoints, metrics, summary, TensorBoard events, MLflow params


@pytest.mark.parametrize("key", ["hub_token", "hf_hub_token", "token"])
def test_a_token_in_a_config_is_refused_without_echoing_it(key, tmp_path, capsys):
    with pytest.raises(ConfigError) as exc:
        load_config(SFTConfig, [{"model": {"path": "m"}, "data": {"path": "d"}, "output_dir": "o", key: CANARY}])
    assert f"{key}: a token does not belong in a config file" in str(exc.value) and "HF_TOKEN" in str(exc.value)
    assert CANARY not in str(exc.value)
    config = tmp_path / "c.yaml"
    config.write_text(f"model_name_or_path: m\ndataset_name: d\noutput_dir: o\n{key}: {CANARY}\n")
    assert main(["sft", "--config", str(config)]) == 2
    printed = capsys.readouterr()
    assert CANARY not in printed.out + printed.err


def test_storage_errors_never_carry_the_token(monkeypatch):
    from trainer_lib.storage import redact

    monkeypatch.setenv("HF_TOKEN", CANARY)
    assert CANARY not in redact(f"401 for https://huggingface.co/x with Authorization: Bearer {CANARY}")
    assert "hf_" + "a" * 30 not in redact("token hf_" + "a" * 30)  # a hub token not in this environment
