"""``batch_size=auto``: the largest micro-batch that fits, found by a probe on the real model.

The global batch the user asked for is kept. Rows per optimizer step per rank are
``T = global_batch_size / world size`` (default ``8 x engine.gradient_accumulation_steps x world``,
what ``batch_size``'s default gives; RL stages: ``mini_batch_size / world``). The micro-batch is
the first size that fits among T, then halvings of it (each the largest divisor of T at most half
the last), and ``engine.gradient_accumulation_steps`` becomes ``T / micro-batch``.

What "fits" means depends on where the model trains:

* an accelerator (CUDA): a real forward and backward of that many rows of synthetic tokens at the
  longest sequence, next to a ballast tensor standing for the optimizer states still to come (by
  DeepSpeed's estimator); ``torch.cuda.OutOfMemoryError`` means no, and the next size is tried;
* host memory: running out there kills the process instead of raising, so the probe measures: the
  peak RSS growth of one row's forward and backward, times the size, must stay within the
  available memory (``MemAvailable``, or the cgroup's limit; shared by the local ranks) less the
  optimizer states still to come.

The probe loads its own copy of the model (with LoRA and gradient checkpointing as configured) and
frees it before the stage loads its own. With ZeRO-3 that copy is whole on each rank, so the probe
is conservative there; a model that does not fit whole on one device needs an explicit batch_size.
All ranks take the smallest size any of them found.
"""

from __future__ import annotations

import functools
import gc
import os
from collections.abc import Callable

from trainer_lib.errors import ConfigError, UserError

AUTO = "auto"
#: ``batch_size``'s default: with ``global_batch_size=0`` auto keeps the global batch it gives.
DEFAULT_BATCH_SIZE = 8
#: Share of the available host memory the estimate may fill (allocator slack, data, tokenizer).
HOST_SAFETY = 0.8


class OutOfHostMemory(MemoryError):
    """A size whose estimated host memory is more than is available (raised instead of running it)."""


# --------------------------------------------------------------------------- the search


def candidates(rows_per_step: int) -> list[int]:
    """``rows_per_step``, then halvings: each the largest divisor of it at most half the last (12: 12, 6, 3, 1)."""
    sizes = [rows_per_step]
    while sizes[-1] > 1:
        half = sizes[-1] // 2
        sizes.append(max(d for d in range(1, half + 1) if rows_per_step % d == 0))
    return sizes


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()  # other accelerators' allocators


def largest_fitting(
    sizes: list[int], fits: Callable[[int], None], free: Callable[[], None] = lambda: None
) -> tuple[int | None, list[int]]:
    """(the first of ``sizes`` for which ``fits(size)`` raises no out-of-memory error, or None; the
    sizes that did not fit). Any other error propagates; ``free()`` runs after each out-of-memory."""
    failed: list[int] = []
    for size in sizes:
        try:
            fits(size)
            return size, failed
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
        failed.append(size)
        free()  # outside the except block: the traceback no longer holds the activations
    return None, failed


# --------------------------------------------------------------------------- host memory


def _rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss_growth(fn: Callable[[], None]) -> int:
    """Bytes the resident set grew to above its level before ``fn`` ran, at its peak.

    Freed heap is returned to the OS first (glibc keeps it otherwise, and a second run would
    reuse it unseen); the peak is the kernel's high-water mark, reset through ``clear_refs``."""
    import ctypes
    import ctypes.util

    gc.collect()
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    before = _rss()
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return _sampled_peak_growth(fn, before)
    fn()
    with open("/proc/self/status", encoding="ascii") as fh:
        peak = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:"))
    return max(peak - before, 0)


def _sampled_peak_growth(fn: Callable[[], None], before: int) -> int:
    """:func:`_peak_rss_growth` where the kernel's high-water mark cannot be reset: RSS sampled every ms."""
    import threading

    peak, done = [before], threading.Event()

    def sample():
        while not done.wait(0.001):
            peak[0] = max(peak[0], _rss())

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(max(peak[0], _rss()) - before, 0)


def host_available() -> int:
    """Bytes of host memory this process can still take: MemAvailable, capped by a cgroup limit."""
    import psutil

    available = psutil.virtual_memory().available
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_file, encoding="ascii") as lf, open(usage_file, encoding="ascii") as uf:
                limit, usage = lf.read().strip(), int(uf.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:
            available = min(available, int(limit) - usage)
        break
    return max(available, 0)


def host_fits(per_row: int, budget: int) -> Callable[[int], None]:
    """``fits(rows)`` for host memory: raises OutOfHostMemory when ``rows x per_row`` exceeds ``budget``."""

    def fits(rows: int) -> None:
        if rows * per_row > budget:
            raise OutOfHostMemory(
                f"{rows} rows need about {rows * per_row / 2**30:.2f} GiB, {max(budget, 0) / 2**30:.2f} GiB available"
            )

    return fits


# --------------------------------------------------------------------------- the probe


class Probe:
    """Forward and backward passes of ``rows x sequences_per_row`` synthetic sequences of ``length``
    tokens through ``model`` (gradients kept, as training keeps them)."""

    def __init__(self, model, device, sequences_per_row: int, length: int):
        self.model, self.device = model, device
        self.sequences_per_row, self.length = sequences_per_row, length
        self.vocab = model.get_input_embeddings().num_embeddings

    def step(self, rows: int) -> None:
        import torch

        # made on the device: a large size must fail there, not fill host memory first (the stage
        # seeds every generator afresh after the probe)
        ids = torch.randint(0, self.vocab, (rows * self.sequences_per_row, self.length), device=self.device)
        loss = self.model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        del loss, ids
        self.model.zero_grad(set_to_none=False)

    def resident_bytes(self) -> int:
        """Parameters and the gradients of the trainable ones: what the probe's model holds while it trains."""
        return sum(p.numel() * p.element_size() * (2 if p.requires_grad else 1) for p in self.model.parameters())


def load_probe_model(cfg, device):
    """The stage's model, whole on ``device`` (loaded straight onto an accelerator, not through host memory)."""
    from trainer_lib.models.load import Placement, apply_lora, load_causal_lm

    placement = Placement(device=None if device.type == "cpu" else str(device))
    model = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision, placement=placement), cfg.lora)
    if cfg.engine.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device).train()


def rows_per_step(cfg, world_size: int) -> int:
    """Rows per optimizer step on each rank that batch_size=auto keeps (module docstring)."""
    if hasattr(cfg, "mini_batch"):  # an RL stage: mini_batch_size sets it
        if cfg.global_batch_size:
            raise ConfigError(
                "global_batch_size: RL stages keep mini_batch_size (completions per optimizer "
                "step, all ranks); set that instead"
            )
        total, key = cfg.mini_batch, "mini_batch_size"
    else:
        total = cfg.global_batch_size or DEFAULT_BATCH_SIZE * cfg.engine.gradient_accumulation_steps * world_size
        key = "global_batch_size"
    if total % world_size:
        raise ConfigError(f"{key}: {total} rows do not split evenly over {world_size} ranks")
    return total // world_size


def choose(cfg, strategy, sequences_per_row: int, length: int, per_rank: int) -> tuple[int | None, list[int], str]:
    """(the size this rank can take or None, the sizes that did not fit, how it was judged)."""
    import torch

    from trainer_lib.engine import deepspeed_file

    user = deepspeed_file.read(cfg.engine.deepspeed_config) if cfg.engine.deepspeed_config else {}
    stage, offload_optimizer, offload_params = deepspeed_file.zero_settings(cfg.engine, user)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", strategy.world_size))
    model = load_probe_model(cfg, strategy.device)
    cpu_states, device_states, line = deepspeed_file.model_states_estimate(
        model, stage, offload_optimizer, offload_params, strategy.world_size, local
    )
    strategy.print(line)
    probe = Probe(model, strategy.device, sequences_per_row, length)
    try:
        if strategy.device.type == "cpu":
            probe.step(1)  # gradients allocated (as they stay in training) before the measured step
            per_row = max(_peak_rss_growth(functools.partial(probe.step, 1)), 1)
            states = device_states + (cpu_states // max(local, 1) if offload_optimizer or offload_params else 0)
            budget = int(host_available() * HOST_SAFETY) // max(local, 1) - max(states - probe.resident_bytes(), 0)
            size, failed = largest_fitting(candidates(per_rank), host_fits(per_row, budget))
            how = (
                f"host memory: {per_row / 2**20:.1f} MiB per row measured, "
                f"{max(budget, 0) / 2**30:.2f} GiB for activations"
            )
        else:
            try:  # the optimizer states still to come
                ballast = torch.empty(
                    max(device_states - probe.resident_bytes(), 0), dtype=torch.uint8, device=strategy.device
                )
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                return None, [], f"the model states alone ({device_states / 2**30:.2f} GiB) do not fit"

            def free():
                gc.collect()
                torch.cuda.empty_cache() if strategy.device.type == "cuda" else None

            size, failed = largest_fitting(candidates(per_rank), probe.step, free)
            held = ballast.numel() / 2**30
            how = f"forward and backward on {strategy.device.type}, {held:.2f} GiB held for optimizer states"
            del ballast
    finally:
        del probe, model
        gc.collect()
        if strategy.device.type == "cuda":
            torch.cuda.empty_cache()
    return size, failed, how


def resolve_batch_size(cfg, *, sequences_per_row: int = 1, sequence_length: int | None = None) -> None:
    """With ``batch_size=auto``, set ``cfg.batch_size`` (and, outside RL, ``cfg.engine.
    gradient_accumulation_steps``) to what fits; call before the stage builds its strategy.
    ``sequences_per_row``: sequences a row of the stage holds (2 for a preference pair);
    ``sequence_length``: the longest sequence (default ``data.max_length``)."""
    if cfg.batch_size != AUTO:
        return
    from trainer_lib.config import EngineConfig
    from trainer_lib.engine.strategy import DeepSpeedStrategy

    strategy = DeepSpeedStrategy(EngineConfig(), micro_batch_size=1, seed=cfg.seed)  # (for the device and group)
    strategy.setup_distributed()
    per_rank = rows_per_step(cfg, strategy.world_size)
    length = sequence_length or cfg.data.max_length
    size, failed, how = choose(cfg, strategy, sequences_per_row, length, per_rank)
    chosen = -strategy.all_reduce(-float(size or 0), op="max")  # the smallest over ranks
    if chosen < 1:
        raise UserError(
            f"batch_size=auto: not even one row of {sequences_per_row} x {length} tokens fits "
            f"({how}); lower data.max_length, or set engine.gradient_checkpointing=true, lora.r, "
            f"a higher engine.zero_stage or offload"
        )
    cfg.batch_size = int(chosen)
    if not hasattr(cfg, "mini_batch"):
        cfg.engine.gradient_accumulation_steps = per_rank // cfg.batch_size
    strategy.print(
        f"batch_size=auto: micro-batch {cfg.batch_size} x {per_rank // cfg.batch_size} accumulation x "
        f"{strategy.world_size} rank(s) = {per_rank * strategy.world_size} rows per optimizer step"
        + (f" ({', '.join(map(str, failed))} did not fit)" if failed else "")
        + f"; {how}"
    )
