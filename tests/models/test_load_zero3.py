"""ZeRO-3 loading on two processes: the model is built partitioned and read from its shards a tensor at a
time, so no rank holds it whole; it computes, trains and saves as a plain load of the same checkpoint does.

The same worker as ``benchmarks/load_memory.py`` (which measures a ~1B model), on a ~37M one."""

import os

import pytest
import torch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # about 25 s on 2 quiet cores


@pytest.fixture(scope="module")
def sharded_llama(tmp_path_factory) -> tuple[str, int]:
    """A random 16-layer, 512-wide Llama saved as fp32 safetensors in shards of at most 40 MB (many thin layers:
    what a rank holds besides its partition is about one layer's MLP, gathered while it is initialised)."""
    from benchmarks.load_memory import build_checkpoint

    out = str(tmp_path_factory.mktemp("models") / "llama37m")
    return out, build_checkpoint(out, layers=16, hidden=512, intermediate=1024, vocab=1000, shard="40MB")


def test_zero3_load_holds_a_partition_per_rank_and_matches_a_plain_load(sharded_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    from benchmarks.load_memory import run_stage

    model_dir, parameters = sharded_llama
    assert sum(name.endswith(".safetensors") for name in os.listdir(model_dir)) > 1  # sharded
    loaded = tmp_path / "loaded"
    records = run_stage(model_dir, 3, 2, str(tmp_path / "records.jsonl"), lora=0, save_loaded=str(loaded))
    assert [r["rank"] for r in records] == [0, 1]

    # each rank's memory grew by about its half of the weights while loading: never a whole copy
    fp32 = parameters * 4
    print({r["rank"]: round(r["load_growth"] / fp32, 3) for r in records}, f"x of {fp32 / 2**20:.0f} MiB fp32")
    assert all(r["load_growth"] < 0.75 * fp32 for r in records), records

    # the partitioned model, gathered and written a tensor at a time, is the checkpoint bit for bit
    plain = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    saved = AutoModelForCausalLM.from_pretrained(loaded).state_dict()
    for name, value in plain.state_dict().items():
        assert torch.equal(saved[name], value), name

    # and it computes what the plain load computes, then trains: each rank's first loss on its own ids
    with torch.no_grad():
        for r in records:
            ids = torch.randint(0, plain.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(r["rank"]))
            assert float(plain(input_ids=ids, labels=ids).loss) == pytest.approx(r["loss"], abs=1e-4)
            assert r["grad_norm"] > 0
