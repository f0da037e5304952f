"""``engine.tiled_mlp`` (DeepSpeed's TiledMLP over each decoder layer's MLP) and ``engine.offload_activations``
(torch's save_on_cpu around the forward): the same loss and gradients as without them, on a row long
enough for several tiles, and the tiles and the offload hooks observed doing their work."""

from __future__ import annotations

import torch

from trainer_lib.engine import activation_memory
from trainer_lib.models.lm_head import causal_lm_loss


def _model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _loss_and_grads(model, batch) -> tuple[float, dict]:
    model.zero_grad()
    loss = causal_lm_loss(model, batch)
    loss.backward()
    return loss.detach().item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _batch(length: int = 200) -> dict:
    ids = torch.randint(4, 300, (1, length), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone(), "position_ids": torch.arange(length)[None]}


def test_tiled_mlps_give_the_untiled_loss_and_gradients_a_tile_at_a_time(tiny_model_dir):
    """200 positions over a hidden size of 64: four tiles (torch.chunk: 50 each) in forward, again in backward."""
    batch = _batch()
    loss, grads = _loss_and_grads(_model(tiny_model_dir), batch)
    model = _model(tiny_model_dir)
    assert activation_memory.tile_mlps(model) == 2  # both decoder layers
    seen: list[int] = []
    mlp = model.model.layers[0].mlp
    untiled = mlp.untiled_forward
    mlp.untiled_forward = lambda x: seen.append(x.shape[-2]) or untiled(x)
    tiled_loss, tiled_grads = _loss_and_grads(model, batch)
    assert seen == [50] * 8
    assert tiled_loss == loss
    assert grads.keys() == tiled_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, tiled_grads[name], atol=1e-6, rtol=1e-5), name
    seen.clear()
    model(input_ids=batch["input_ids"][:, :40])  # one tile: the MLP as it was
    assert seen == [40]


def test_offloaded_activations_go_through_the_save_hooks_and_change_nothing(tiny_model_dir):
    batch = _batch(48)
    loss, grads = _loss_and_grads(_model(tiny_model_dir), batch)
    model = _model(tiny_model_dir)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    activation_memory.offload_saved_activations(model)
    hooked: list[bool] = []
    layer = model.model.layers[0]
    layer.register_forward_pre_hook(
        lambda *_: hooked.append(torch._C._autograd._top_saved_tensors_default_hooks(False) is not None)
    )
    offloaded_loss, offloaded_grads = _loss_and_grads(model, batch)
    assert hooked and hooked[0]  # the forward ran with saved tensors packed to host memory
    assert abs(offloaded_loss - loss) < 1e-6
    for name, grad in grads.items():
        assert torch.allclose(grad, offloaded_grads[name], atol=1e-6, rtol=1e-5), name
