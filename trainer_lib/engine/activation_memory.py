"""Activation memory at long sequence length: the MLP a tile of positions at a time, and the activations
kept for backward held in host memory (``engine.tiled_mlp``, ``engine.offload_activations``).

At 32k+ tokens a decoder layer's activations outgrow its weights. Three things take most of it, and
each has one way of being cut here:

* the LM head's logits (``N x vocab`` floats): our tiled LM head (``models/lm_head.py``) scores a tile of
  positions at a time and never holds them. It stays rather than DeepSpeed's ``TiledFusedLogitsLoss``
  because every stage reads log-probs, entropies and distillation states through it, not only SFT's loss;
* the MLP's intermediate activations (``N x intermediate``, three of them for a gated MLP): DeepSpeed's
  ``TiledMLP`` (ALST) runs the MLP over tiles of ``hidden_size`` positions without keeping them, and
  recomputes each tile in backward;
* the layers' saved inputs under gradient checkpointing: torch's ``save_on_cpu`` moves what autograd
  keeps for backward to host memory (pinned on a GPU) as the forward runs and brings it back for the
  backward, which is ALST's checkpoint offload; on a CPU it changes nothing but a copy.
"""

from __future__ import annotations

import functools
import math
import types


def tile_mlps(model) -> int:
    """Run every decoder layer's ``mlp`` of ``model`` over tiles of ``hidden_size`` positions (DeepSpeed's
    ``TiledMLP``: the tiles' activations recomputed in backward, never all held); returns how many."""
    count = 0
    for module in model.modules():
        mlp = getattr(module, "mlp", None)
        if mlp is None or not hasattr(mlp, "forward") or hasattr(mlp, "untiled_forward"):
            continue
        mlp.untiled_forward = mlp.forward
        mlp.forward = types.MethodType(_tiled_forward, mlp)
        count += 1
    return count


def _tiled_forward(self, x):
    """An MLP's forward a tile of ``hidden_size`` positions at a time; one tile (a short input): as it was.
    ZeRO's gradient hooks are told to wait for the last tile (``TiledMLP``'s ``compute_params``)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    tiles = math.ceil(x.shape[-2] / x.shape[-1])
    params = [p for p in self.parameters() if p.requires_grad]
    if any(hasattr(p, "ds_id") for p in self.parameters()):  # ZeRO-3 gathers per call: ranks run as many tiles
        tiles = _agreed(tiles, x.device)
    if tiles <= 1:
        return self.untiled_forward(x)
    return TiledMLP.apply(_call_untiled, self, x, tiles, params)


def _call_untiled(module, x):
    return module.untiled_forward(x)


def _agreed(tiles: int, device) -> int:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return tiles
    value = torch.tensor(tiles, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return int(value)


def offload_saved_activations(model) -> None:
    """Hold what autograd saves during ``model``'s forward in host memory until backward needs it (torch's
    ``save_on_cpu``, pinned when the model is on an accelerator)."""
    forward = model.forward

    @functools.wraps(forward)  # the signature stays readable (models/lm_head.py asks for logits_to_keep)
    def offloaded(*args, **kwargs):
        import torch

        device = next(model.parameters()).device
        with torch.autograd.graph.save_on_cpu(pin_memory=device.type != "cpu"):
            return forward(*args, **kwargs)

    model.forward = offloaded
