"""Loading models and tokenizers: model.revision picks the hub commit (read offline from a hub cache), also
for a model built partitioned under ZeRO-3."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json, sys
from trainer_lib.config import ModelConfig
from trainer_lib.errors import UserError
from trainer_lib.models.load import load_causal_lm, load_tokenizer
for revision in sys.argv[1:-1]:  # (the last: the v2 snapshot directory)
    cfg = ModelConfig(path="org/tiny", revision=revision)
    try:
        model, tokenizer = load_causal_lm(cfg), load_tokenizer(cfg)
        print(json.dumps({"revision": revision, "layers": model.config.num_hidden_layers,
                          "vocab": len(tokenizer)}))
    except UserError as exc:
        print(json.dumps({"revision": revision, "error": str(exc)}))

# ZeRO-3: built partitioned, each weight read from the v2 snapshot in the hub cache
from safetensors.torch import load_file
from trainer_lib.config import EngineConfig
from trainer_lib.engine.strategy import DeepSpeedStrategy
strategy = DeepSpeedStrategy(EngineConfig(zero_stage=3), micro_batch_size=1)
strategy.setup_distributed()
model = load_causal_lm(ModelConfig(path="org/tiny", revision="v2"), placement=strategy.placement())
snapshot = load_file(sys.argv[-1] + "/model.safetensors")
same = []
for name, param in model.named_parameters():
    with strategy.gathered([param]):
        same.append(name in snapshot and bool((param == snapshot[name]).all()) and param.ds_tensor.numel() > 0)
print(json.dumps({"zero3_layers": model.config.num_hidden_layers, "partitioned_and_same": all(same)}))
"""


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A Hugging Face hub cache holding two commits of ``org/tiny``: main (1 layer), tag v2 (2 layers)."""
    from trainer_lib.demo.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("hub")
    repo = root / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    for ref, commit, layers in (("main", "a1" * 20, 1), ("v2", "b2" * 20, 2)):
        make_tiny_model(
            str(repo / "snapshots" / commit),
            ["hello world, a tiny corpus"] * 20,
            vocab_size=270,
            num_layers=layers,
            hidden_size=32,
        )
        (repo / "refs" / ref).write_text(commit)
    return str(root)


def test_model_revision_picks_the_commit(hub_cache):
    snapshot = os.path.join(hub_cache, "models--org--tiny", "snapshots", "b2" * 20)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": hub_cache}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "", "v2", "b2" * 20, "nope", snapshot],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r.get("layers") for r in results[:3]] == [1, 2, 2]  # main, the v2 tag, its commit sha
    assert results[0]["vocab"] == results[1]["vocab"]
    assert results[3]["error"].startswith("model.path: could not load a causal LM from org/tiny at revision 'nope'")
    assert results[4] == {"zero3_layers": 2, "partitioned_and_same": True}


def test_a_revision_does_not_follow_the_model_to_another_path():
    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import hub_revision

    cfg = ModelConfig(path="org/policy", revision="v2")
    assert hub_revision(cfg, "org/policy") == "v2"
    assert hub_revision(cfg, "org/reward-model") is None  # a reward model is not pinned by the policy's revision


def test_a_damaged_safetensors_file_is_one_line_naming_it_and_the_key(tiny_model_dir, chat_jsonl, tmp_path, capsys):
    """A header that claims 2**40 bytes, a header that is not a table, a file cut short: ``posttrain sft``
    ends with one line naming the file and the key, exit 2, not safetensors' traceback."""
    import shutil

    from trainer_lib.cli import main

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    good = weights.read_bytes()
    length = int.from_bytes(good[:8], "little")
    for damaged, words in (
        ((2**40).to_bytes(8, "little") + good[8:], "its header claims 1099511627776 bytes"),
        (good[:8] + b"[" * length + good[8 + length :], "its header is not a table of tensors"),
        (good[:-100], "it is cut short"),
    ):
        weights.write_bytes(damaged)
        capsys.readouterr()
        args = [f"model.path={model}", f"data.path={chat_jsonl}", f"output_dir={tmp_path / 'out'}", "max_steps=1"]
        assert main(["sft", *args]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"error: model.path: {weights} is a damaged safetensors file: ") and words in line
