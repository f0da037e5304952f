"""export stage: ONNX FP32/FP16/INT8/INT4 with a parity report, published only when the checks pass."""

import json
import os
import shutil

import pytest

from tests.export.helpers import near_tie_model_dir, trained_model_dir  # noqa: F401  (fixtures)
from trainer_lib.cli import main
from trainer_lib.errors import UserError

SMALL = ["parity.num_prompts=4", "parity.max_new_tokens=8", "parity.latency_tokens=8"]


@pytest.fixture(scope="module")
def export_dir(trained_model_dir, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("export")
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"prompt": "What is two plus two?"})
        + "\n\n"
        + json.dumps(
            {"messages": [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello there!"}]}
        )
        + "\n"
        + json.dumps({"prompt": [{"role": "user", "content": "Name a color."}]})
        + "\n"
        + json.dumps({"prompt": "Is the sky green?"})
        + "\n"
        + json.dumps({"prompt": "not used: num_prompts=4"})
        + "\n"
    )
    out = root / "out"
    assert (
        main(
            [
                "export",
                f"model_path={trained_model_dir}",
                f"output_dir={out}",
                "int4=true",
                f"parity.prompts={prompts}",
                *SMALL,
            ]
        )
        == 0
    )
    return out


VARIANTS = ("fp32", "fp16", "int8", "int4")


def test_writes_every_artifact(export_dir):
    for variant in VARIANTS:
        assert sorted(os.listdir(export_dir / "onnx" / variant)) == ["model.onnx", "model.onnx.data"]
    assert sorted(os.listdir(export_dir / "onnx")) == sorted(VARIANTS)  # no slice or temp file left
    assert (export_dir / "tokenizer" / "tokenizer.json").exists()
    assert not [p for p in os.listdir(export_dir.parent) if p.startswith(".export-")]  # no temp dir left
    summary = json.loads((export_dir / "export.json").read_text())
    assert summary["models"] == {v: f"onnx/{v}/model.onnx" for v in VARIANTS}
    assert summary["cache_dtype"] == {"fp32": "float32", "fp16": "float16", "int8": "float32", "int4": "float32"}
    assert summary["fp16_source"].startswith("converted from fp32")  # no CUDA here
    assert summary["fp32_max_abs_diff"] < 1e-3 and summary["num_layers"] == 2
    assert summary["max_abs_diff"]["fp32"] == summary["fp32_max_abs_diff"] < summary["max_abs_diff"]["fp16"]


def test_parity_report_has_every_figure(export_dir):
    report = json.loads((export_dir / "parity.json").read_text())
    assert report["prompts"] == 4 and report["max_new_tokens"] == 8
    for variant in VARIANTS:
        figures = report[variant]
        for phase in ("prefill", "decode"):
            assert set(figures[phase]) == {"max_abs_diff", "mean_abs_diff"}
        for key in (
            "top1_agreement",
            "greedy_exact_match",
            "file_bytes",
            "weight_bytes",
            "decode_ms_per_token",
            "tokens_per_s",
        ):
            assert figures[key] >= 0, (variant, key)
        assert figures["greedy_prompts"] == 4 and figures["providers"] == ["CPUExecutionProvider"]
    assert report["pytorch"]["decode_ms_per_token"] > 0 and report["pytorch"]["tokens_per_s"] > 0
    assert report["fp32"]["prefill"]["max_abs_diff"] < 1e-3 and report["fp32"]["decode"]["max_abs_diff"] < 1e-3
    assert report["fp32"]["greedy_exact_match"] == 1.0 and report["fp32"]["top1_agreement"] == 1.0
    assert report["int8"]["top1_agreement"] >= report["thresholds"]["int8_min_top1_agreement"] == 0.95
    assert report["int8"]["weight_ratio_vs_fp32"] >= 3.0
    # FP16: rounding shows in the logits but picks the same tokens; every weight is halved
    for phase in ("prefill", "decode"):
        assert 1e-4 < report["fp16"][phase]["max_abs_diff"] < 2e-2
    assert report["fp16"]["top1_agreement"] == report["fp16"]["greedy_exact_match"] == 1.0
    assert report["thresholds"]["fp16_min_top1_agreement"] == 0.95
    assert 1.95 < report["fp16"]["weight_ratio_vs_fp32"] <= 2.0


@pytest.mark.parametrize("variant", ["int8", "fp16"])
def test_the_exported_model_generates(export_dir, variant):
    from transformers import AutoTokenizer

    from trainer_lib.export.ort_generate import OrtDecoder

    tokenizer = AutoTokenizer.from_pretrained(export_dir / "tokenizer")
    ids = tokenizer("What is two plus two?")["input_ids"]
    text = tokenizer.decode(
        OrtDecoder(str(export_dir / "onnx" / variant)).generate([ids], 8, eos_token_id=tokenizer.eos_token_id)[0],
        skip_special_tokens=True,
    )
    assert "Four" in text


def test_impossible_fp32_threshold_fails_and_keeps_the_old_export(
    export_dir,
    trained_model_dir,  # noqa: F811
    tmp_path,
    capsys,
):
    out = tmp_path / "out"
    shutil.copytree(export_dir, out)
    before = {p: os.path.getmtime(os.path.join(root, p)) for root, _, files in os.walk(out) for p in files}
    marker = (out / "export.json").read_text()
    assert (
        main(
            ["export", f"model_path={trained_model_dir}", f"output_dir={out}", "parity.fp32_max_abs_diff=1e-12", *SMALL]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "parity.fp32_max_abs_diff" in err and "differ from PyTorch" in err
    assert (out / "export.json").read_text() == marker
    assert before == {p: os.path.getmtime(os.path.join(root, p)) for root, _, files in os.walk(out) for p in files}
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the work directory is gone


def test_a_variant_below_its_threshold_is_left_out_and_named(near_tie_model_dir, tmp_path, capsys):  # noqa: F811
    from trainer_lib.export.variants import resolve

    out = tmp_path / "out"
    overrides = ["parity.int8_min_top1_agreement=0", *SMALL]  # FP16's own threshold at its default
    assert main(["export", f"model_path={near_tie_model_dir}", f"output_dir={out}", *overrides]) == 0
    assert "export: fp16 left out: parity.fp16_min_top1_agreement: top-1 agreement" in capsys.readouterr().err
    summary = json.loads((out / "export.json").read_text())
    assert sorted(summary["models"]) == ["fp32", "int8"] and list(summary["failed"]) == ["fp16"]
    assert summary["failed"]["fp16"].endswith("< 0.95")
    assert sorted(os.listdir(out / "onnx")) == ["fp32", "int8"]  # measured, not written
    assert json.loads((out / "parity.json").read_text())["fp16"]["written"] is False
    with pytest.raises(UserError, match="variant: the export left fp16 out because it failed its parity"):
        resolve(str(out), "fp16", "variant", "export.path")
    assert resolve(str(out), "auto", "variant", "export.path") == "int8"  # the smallest written
    repository = tmp_path / "repository"
    assert main(["deploy", f"export.path={out}", f"repository={repository}", "variant=fp16"]) == 2
    assert "variant: the export left fp16 out" in capsys.readouterr().err and not repository.exists()
    assert main(["deploy", f"export.path={out}", f"repository={repository}", "variant=auto"]) == 0
    assert json.loads(capsys.readouterr().out)["variant"] == "int8"


def test_s3_model_and_output(trained_model_dir, s3_bucket):  # noqa: F811
    from trainer_lib import storage
    from trainer_lib.export.ort_generate import OrtDecoder

    model_uri, out_uri = f"s3://{s3_bucket}/models/trained", f"s3://{s3_bucket}/exports/run1"
    storage.copy(trained_model_dir, model_uri)
    assert (
        main(
            [
                "export",
                f"model_path={model_uri}",
                f"output_dir={out_uri}",
                "parity.num_prompts=2",
                "parity.max_new_tokens=4",
                "parity.latency_tokens=4",
                "parity.int8_min_top1_agreement=0",
                "fp16=false",
            ]
        )
        == 0
    )
    summary = json.loads(storage.read_text(f"{out_uri}/export.json"))
    assert summary["model_path"] == model_uri and sorted(summary["models"]) == ["fp32", "int8"]
    assert "fp16_source" not in summary and "fp16" not in json.loads(storage.read_text(f"{out_uri}/parity.json"))
    assert not storage.exists(f"{out_uri}/onnx/fp16/model.onnx")
    for name in ("onnx/fp32/model.onnx.data", "onnx/int8/model.onnx", "tokenizer/tokenizer.json", "parity.json"):
        assert storage.exists(f"{out_uri}/{name}"), name
    assert OrtDecoder(storage.localize(f"{out_uri}/onnx/int8")).generate([[5, 6]], 2)
    assert main(["export", f"model_path=s3://{s3_bucket}/models/missing", f"output_dir={out_uri}-2"]) == 2
    assert not storage.exists(f"{out_uri}-2/export.json")


def test_missing_model_path(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["export", f"model_path={tmp_path / 'nope'}", f"output_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "model_path" in err and "does not exist" in err
    assert not out.exists()


def test_not_a_model_directory(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", f"model_path={tmp_path / 'empty'}", f"output_dir={tmp_path / 'out'}"]) == 2
    assert "model_path" in capsys.readouterr().err


def test_bad_prompts_file_names_the_line(trained_model_dir, tmp_path, capsys):  # noqa: F811
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"question": "?"}) + "\n")
    assert (
        main(
            ["export", f"model_path={trained_model_dir}", f"output_dir={tmp_path / 'out'}", f"parity.prompts={prompts}"]
        )
        == 2
    )
    assert f"{prompts}:2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "override, key",
    [
        ("parity.fp32_max_abs_diff=-1", "parity.fp32_max_abs_diff"),
        ("parity.int8_min_top1_agreement=1.5", "parity.int8_min_top1_agreement"),
        ("parity.fp16_min_top1_agreement=-0.1", "parity.fp16_min_top1_agreement"),
        ("parity.num_prompts=0", "parity.num_prompts"),
        ("opset=13", "opset"),
        ("quantize.int4_block_size=48", "quantize.int4_block_size"),
    ],
)
def test_config_errors_name_the_key(override, key, tmp_path, capsys):
    assert main(["export", f"model_path={tmp_path}", f"output_dir={tmp_path / 'out'}", override]) == 2
    assert capsys.readouterr().err.startswith(f"error: {key}:")


def test_output_dir_is_required(tmp_path, capsys):
    assert main(["export", f"model_path={tmp_path}"]) == 2
    assert "output_dir: required" in capsys.readouterr().err


def test_help_lists_the_keys(capsys):
    assert main(["export", "--help"]) == 0
    out = capsys.readouterr().out
    for key in (
        "model_path",
        "int4",
        "parity.fp32_max_abs_diff",
        "parity.int8_min_top1_agreement",
        "parity.fp16_min_top1_agreement",
        "parity.int4_min_top1_agreement",
        "parity.with_answers",
        "fp16",
        "quantize.embeddings",
        "parity.prompts",
    ):
        assert key in out
