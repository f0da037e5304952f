"""The metrics window: means and counts by hand, the exact old arithmetic, sums kept on the device."""

import math
import random
from types import SimpleNamespace

import pytest
import torch
from torch.overrides import TorchFunctionMode

from trainer_lib.config import EngineConfig
from trainer_lib.engine.strategy import DeepSpeedStrategy
from trainer_lib.errors import NonFiniteLossError
from trainer_lib.loop.cadence import Cadence
from trainer_lib.loop.metrics import MetricsWindow, means_of, sums_and_counts


@pytest.fixture
def strategy():
    strategy = DeepSpeedStrategy(EngineConfig(), micro_batch_size=1)
    strategy.device = torch.device("cpu")  # (set by setup_distributed in a run)
    return strategy


def test_means_and_counts_of_tensors_and_floats(strategy):
    window = MetricsWindow(keys=("kl",))
    window.add("loss", torch.tensor([1.0, 2.0, 3.0]))  # three values
    window.add("loss", 4.0)  # one value
    window.add_all({"loss": torch.tensor(5.0), "reward": 0.5})
    window.add("reward", torch.tensor([[1.5], [2.5]]))
    window.count(samples=4, tokens=40)
    window.count(samples=2, tokens=20)
    assert window.sums["loss"].count == 5.0 and window.sums["reward"].count == 3.0
    record = window.reduce(strategy)
    assert record["loss"] == (1 + 2 + 3 + 4 + 5) / 5
    assert record["reward"] == (0.5 + 1.5 + 2.5) / 3
    assert "kl" not in record  # declared, never seen: no mean
    assert list(record)[-3:] == ["samples_per_s", "tokens_per_s", "tokens"]
    assert record["tokens_per_s"] == pytest.approx(10 * record["samples_per_s"])
    assert record["tokens"] == 60  # the window's tokens (the dashboard's running sum: tokens seen)
    assert window.sums == {"kl": type(window.sums["kl"])()}  # the next window is open and empty


def test_a_declared_key_takes_part_in_the_all_reduce_with_zeros(strategy):
    seen = []
    reduce = strategy.all_reduce
    strategy.all_reduce = lambda value, op="mean": seen.append(value) or reduce(value, op)
    window = MetricsWindow(keys=("kl", "loss"))
    window.add("loss", torch.tensor([2.0, 4.0]))
    assert window.reduce(strategy)["loss"] == 3.0
    sent, vector = seen  # one all-reduce for the whole record: the dict travels as one vector
    assert vector.shape == (6,) and vector.dtype == torch.float64
    assert sent["kl"] == 0.0 and sent["kl#n"] == 0.0  # every rank sends the same keys
    assert set(sent) == {"kl", "kl#n", "loss", "loss#n", "#samples", "#tokens"}


def _old_record(calls: list[dict]) -> dict:
    """What the window logged before its sums stayed on the device: Python floats throughout."""
    sums: dict = {}
    for values in calls:
        for key, value in sums_and_counts(values).items():
            sums[key] = sums.get(key, 0.0) + value
    return means_of(sums, sorted(k for k in sums if not k.endswith("#n")))


def test_the_means_equal_the_old_float_arithmetic_to_the_last_bit(strategy):
    rng = random.Random(0)
    torch.manual_seed(0)
    calls = []
    for index in range(200):
        values = {
            "loss": torch.randn(()) * 3,
            "per_example": torch.randn(rng.randint(1, 9), dtype=torch.bfloat16),
            "wide": torch.randn(7, dtype=torch.float64) * 1e3,  # summed in float32, as before
            "time": rng.random() / 3,
        }
        values["mixed"] = torch.rand(5) / 7 if index % 3 else rng.random() / 7  # tensors and floats in one key
        calls.append(values)
    window = MetricsWindow()
    for values in calls:
        window.add_all(values)
    assert all(window.sums[k].total.dtype == torch.float64 for k in ("loss", "per_example", "wide", "mixed"))
    assert isinstance(window.sums["time"].total, float)  # plain numbers stay numbers
    record = window.reduce(strategy)
    expected = _old_record(calls)
    assert {k: record[k] for k in expected} == expected  # ==: bit for bit


def test_tensor_sums_are_not_read_back_until_reduced():
    # meta tensors hold no values: any read from them (float(), .item()) raises
    window = MetricsWindow(keys=("policy_loss",))
    window.add("loss", torch.ones(4, device="meta"))
    window.add("loss", 2.0)
    window.add_all({"policy_loss": torch.ones((), device="meta"), "reward": 1.0})
    assert window.sums["loss"].total.device.type == "meta" and window.sums["loss"].count == 5.0
    flag = window.nonfinite(["loss", "policy_loss"])
    assert isinstance(flag, torch.Tensor) and flag.device.type == "meta" and flag.dtype == torch.float64


def test_nonfinite_flags_nan_and_inf_in_floats_and_tensors():
    window = MetricsWindow(keys=("value_loss",))
    window.add("loss", 1.0)
    assert window.nonfinite(["loss", "value_loss"]) == 0.0
    window.add("loss", float("inf"))
    assert window.nonfinite(["loss"]) > 0
    window.add("policy_loss", torch.tensor([1.0, 2.0]))
    window.add("reward", torch.tensor([math.nan]))  # not asked about
    assert float(window.nonfinite(["policy_loss", "value_loss", "reward"][:2])) == 0.0
    assert float(window.nonfinite(["policy_loss", "reward"])) > 0
    window.add("policy_loss", torch.tensor([math.nan, 1.0]))
    assert float(window.nonfinite(["policy_loss"])) > 0
    assert math.isnan(window.totals(["policy_loss"])["policy_loss"])


def _cadence(strategy) -> Cadence:
    """Just what :meth:`Cadence.check_finite` reads."""
    cadence = Cadence.__new__(Cadence)
    cadence.stage, cadence.strategy, cadence.engine = "sft", strategy, object()
    cadence.ckpt = SimpleNamespace(latest_step=lambda: 3, ckpt_root="/ckpt")
    cadence.window = MetricsWindow()
    cadence.heartbeat = SimpleNamespace(end=lambda state: None)
    return cadence


def test_check_finite_stops_at_a_nonfinite_loss_only(strategy):
    cadence = _cadence(strategy)
    cadence.window.add_all({"loss": torch.tensor([1.0, 2.0]), "reward": torch.tensor(math.inf), "kl": math.nan})
    cadence.check_finite(4)  # only losses are checked
    cadence.window.add_all({"loss": torch.tensor([3.0]), "value_loss": torch.tensor([math.nan]), "policy_loss": 1.0})
    with pytest.raises(NonFiniteLossError, match=r"step 5: .*\(value_loss=nan\).*checkpoint is step 3 in /ckpt"):
        cadence.check_finite(5)


class DeviceReads(TorchFunctionMode):
    """Counts the calls that read a tensor's value back to the host (a wait for the device on a GPU)."""

    READS = ("item", "tolist", "__float__", "__bool__", "__int__")

    def __init__(self):
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_one_read_per_step_check_and_one_per_record_whatever_the_number_of_metrics(strategy):
    cadence = _cadence(strategy)
    with DeviceReads() as counter:
        for step in range(3):
            for _ in range(4):  # micro-batches
                losses = {f"{name}_loss": torch.rand(8) for name in ("policy", "value", "aux")}
                cadence.window.add_all({"loss": torch.rand(()), **losses, "entropy": torch.rand(8), "lr_scale": 0.5})
                cadence.window.count(samples=8, tokens=64)
            assert len(counter.reads) == step, "adding metrics read the device"
            cadence.check_finite(step + 1)
            assert len(counter.reads) == step + 1  # one flag for all four losses
        record = cadence.window.reduce(strategy)
    assert counter.reads == ["__float__"] * 3 + ["tolist"]
    assert set(record) == {
        "loss",
        "policy_loss",
        "value_loss",
        "aux_loss",
        "entropy",
        "lr_scale",
        "samples_per_s",
        "tokens_per_s",
        "tokens",
    }


def test_a_tensor_group_counts_its_rows_once(strategy):
    """Under parallel.tensor=2 both ranks of the group count the same rows: the all-reduced work is
    halved, the means are not (two ranks simulated: the all-reduce doubles every sum)."""
    from trainer_lib.config.sections import ParallelConfig

    def record(parallel):
        strategy.parallel = parallel
        strategy.all_reduce = lambda value, op="mean": {k: 2 * v for k, v in value.items()}
        window = MetricsWindow()
        window.add("loss", 3.0)
        window.count(samples=4, tokens=40)
        window.start -= 10.0  # ten seconds of work
        return window.reduce(strategy)

    data, tensor = record(ParallelConfig()), record(ParallelConfig(tensor=2))
    assert data["loss"] == tensor["loss"] == 3.0
    assert tensor["samples_per_s"] == pytest.approx(data["samples_per_s"] / 2, rel=1e-3)
    assert tensor["tokens_per_s"] == pytest.approx(4.0, rel=1e-3)  # 40 tokens in 10 s, counted once
    assert (data["tokens"], tensor["tokens"]) == (80, 40)
