"""What each benchmark child measures, identically on both sides (ours and TRL's).

Imports only torch and transformers, so it runs in ``.venv-bench`` as well as in ``.venv``:

* trained tokens: non-padding tokens of every forward of the Llama body that builds a graph
  (training mode, grad enabled), counted by a forward pre-hook on every ``LlamaModel``;
  reference-model and rollout forwards (no grad) are not counted;
* generated tokens: tokens ``generate`` returns after the prompt, padding excluded (our decode loop's
  tokens alike);
* step ends: the caller calls :meth:`Probe.step_end` (our ``Cadence.after_step``, TRL's
  ``TrainerCallback.on_step_end``); the first ``warmup`` steps are left out of the timing;
* peak memory: peak RSS of this process (CPU) or ``torch.cuda.max_memory_allocated`` (CUDA);
* machine peak: a large matmul timed in this process, for model FLOPs utilisation
  ``6 * params * trained_tokens / seconds / peak``, where ``params`` are the matmul parameters a token
  goes through: the body without its embedding table (a lookup, no FLOPs), plus the LM head's
  ``vocab x hidden`` when the model has one (a causal LM; a reward model's score head is ``hidden x 1``);
* with ``spec["profile"]``: ``torch.profiler`` over the timed steps, reported as each operator's
  share of self CPU time (what a step spends its time in; the profiler slows the step, so a
  profiled run's throughput is not a benchmark figure).
"""

from __future__ import annotations

import functools
import json
import resource
import time


def measure_peak_flops(device: str, size: int = 2048, reps: int = 5) -> float:
    """FLOP/s of a ``size`` x ``size`` matmul (fp32 on CPU, bf16 on CUDA), best of ``reps``."""
    import torch

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(reps + 1):  # the first one warms up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        (a @ b).sum().item()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


#: operator groups of a profile (self CPU time of ops whose name contains one of the parts)
OP_GROUPS = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"),
    "attention": ("scaled_dot_product", "flash_attention", "aten::softmax", "aten::_softmax"),
    "log-softmax / cross-entropy": ("log_softmax", "nll_loss", "cross_entropy", "logsumexp"),
    "optimizer": ("adam", "Adam", "_foreach", "lerp", "addcdiv", "addcmul"),
    "copies / layout": (
        "aten::copy_",
        "aten::cat",
        "aten::clone",
        "aten::contiguous",
        "aten::to",
        "aten::index",
        "aten::gather",
        "aten::scatter",
        "aten::fill_",
        "aten::zero_",
    ),
}


def profile_shares(profiler, top: int = 10) -> dict:
    """Self-CPU-time shares of a finished ``torch.profiler.profile``: the ``top`` operators and OP_GROUPS."""
    events = [e for e in profiler.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)
    groups = {name: 0.0 for name in OP_GROUPS}
    for e in events:
        for name, parts in OP_GROUPS.items():
            if any(part in e.key for part in parts):
                groups[name] += e.self_cpu_time_total / total
                break
    groups["other"] = 1.0 - sum(groups.values())
    return {
        "total_self_cpu_s": total / 1e6,
        "groups": groups,
        "top": [[e.key, e.self_cpu_time_total / total] for e in ranked[:top]],
    }


class Probe:
    def __init__(self, device: str, warmup: int, profile_until: int = 0):
        """``profile_until`` > 0: profile from the end of the warm-up steps to the end of that step."""
        self.device, self.warmup = device, warmup
        self.profile_until = profile_until
        self.profiler = None
        self.profile: dict | None = None
        self.trained_tokens = 0
        self.generated_tokens = 0
        self.generate_rows = 0
        self.marks: list[tuple[float, int, int]] = []  # (time, trained, generated) at each step end
        self.losses: list[float] = []
        self.parameters = 0  # matmul parameters per trained token (module doc)
        self.head_parameters = 0
        self.one_off_seconds = 0.0  # work done once for the whole run (DPO's precomputed reference)
        self.peak_flops = measure_peak_flops(device)

    def install(self) -> None:
        """Wrap ``forward`` and ``generate`` of the benchmark's model classes (both sides use them)."""
        import torch
        import transformers

        probe = self

        def count(module, args, kwargs):
            if not (module.training and torch.is_grad_enabled()):
                return
            mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids", args[0] if args else None)
            if mask is not None and mask.dim() == 2:
                probe.trained_tokens += int(mask.sum())
            elif ids is not None:
                probe.trained_tokens += int(ids.numel())
            else:
                probe.trained_tokens += int(kwargs["inputs_embeds"].shape[:2].numel())
            if not probe.parameters:  # the body's matmuls: its parameters less the embedding table
                table = module.get_input_embeddings().weight.numel()
                probe.parameters = sum(p.numel() for p in module.parameters()) - table + probe.head_parameters

        # A hook on every LlamaModel instance (the body under both heads): trainers may replace the
        # top-level forward (TRL's fused LM head), but they still call the body through nn.Module.
        init = transformers.LlamaModel.__init__

        @functools.wraps(init)
        def hooked_init(self, *args, **kwargs):
            init(self, *args, **kwargs)
            self.register_forward_pre_hook(count, with_kwargs=True)

        transformers.LlamaModel.__init__ = hooked_init
        head_init = transformers.LlamaForCausalLM.__init__

        @functools.wraps(head_init)
        def counted_head_init(self, *args, **kwargs):
            head_init(self, *args, **kwargs)
            probe.head_parameters = self.lm_head.weight.numel()  # tied or not, a matmul per token

        transformers.LlamaForCausalLM.__init__ = counted_head_init
        generate = transformers.LlamaForCausalLM.generate

        @functools.wraps(generate)
        def counted_generate(self, *args, **kwargs):
            out = generate(self, *args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            sequences = out.sequences if hasattr(out, "sequences") else out
            new = sequences[:, ids.shape[1] :]
            pad = self.generation_config.pad_token_id
            probe.generated_tokens += int((new != pad).sum()) if pad is not None else int(new.numel())
            probe.generate_rows += int(new.shape[0])
            return out

        transformers.LlamaForCausalLM.generate = counted_generate
        self._count_own_decode()

    def _count_own_decode(self) -> None:
        """Our rollouts decode with trainer_lib.rl.decode.decode, not ``generate``: count its new tokens alike
        (eos included, nothing after it). Absent in ``.venv-bench``, where only TRL runs."""
        try:
            from trainer_lib.rl import decode as own
        except ImportError:
            return
        probe, decode = self, own.decode

        @functools.wraps(decode)
        def counted_decode(*args, **kwargs):
            out = decode(*args, **kwargs)
            probe.generated_tokens += sum(len(row) for row in out.tokens)
            probe.generate_rows += len(out.tokens)
            return out

        own.decode = counted_decode

    def step_end(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()
        self.marks.append((time.perf_counter(), self.trained_tokens, self.generated_tokens))
        if self.profile_until and self.profiler is None and len(self.marks) == max(self.warmup, 1):
            import torch

            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profiler.__enter__()
        elif self.profiler is not None and self.profile is None and len(self.marks) >= self.profile_until:
            self.profiler.__exit__(None, None, None)
            self.profile = profile_shares(self.profiler)

    @classmethod
    def from_spec(cls, spec: dict) -> Probe:
        return cls(spec["device"], spec["warmup"], spec["steps"] if spec.get("profile") else 0)

    def peak_memory_bytes(self) -> int:
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated())
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

    def result(self, prompts_per_step: int = 0) -> dict:
        """Figures over the steps after the first ``warmup`` ones."""
        if len(self.marks) < 2:
            raise RuntimeError(f"only {len(self.marks)} step ends were seen; need at least 2")
        warmup = min(max(self.warmup, 1), len(self.marks) - 1)  # the end of step `warmup` opens the window
        t0, trained0, generated0 = self.marks[warmup - 1]
        t1, trained1, generated1 = self.marks[-1]
        steps = len(self.marks) - warmup
        # one-off work is charged to the timed steps pro rata: it served every step of the run
        seconds = max(t1 - t0 + self.one_off_seconds * steps / len(self.marks), 1e-9)
        trained = trained1 - trained0
        out = {
            "timed_steps": steps,
            "seconds": seconds,
            "one_off_seconds": self.one_off_seconds,
            "trained_tokens": trained,
            "tokens_per_s": trained / seconds,
            "peak_memory_bytes": self.peak_memory_bytes(),
            "final_loss": self.losses[-1] if self.losses else float("nan"),
            "parameters": self.parameters,
            "peak_flops": self.peak_flops,
            "mfu": 6 * self.parameters * trained / seconds / self.peak_flops,
        }
        if self.profile is not None:
            out["profile"] = self.profile
        if prompts_per_step:
            out["generated_tokens_per_s"] = (generated1 - generated0) / seconds
            out["prompts_per_s"] = prompts_per_step * steps / seconds
        return out


def write_result(path: str, result: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f)
