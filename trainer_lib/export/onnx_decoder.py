"""ONNX export of a Hugging Face causal LM: one decoder graph with a KV cache.

Exporter: ``torch.onnx.export(..., dynamo=True)`` (torch.export, translated by onnxscript) on a
thin wrapper that turns the past tensors into a ``DynamicCache``, calls the model and returns
the cache's tensors as presents. Alternatives, and why not:

* optimum-onnx (<= 0.1) requires transformers < 4.58; with 5.x its import fails.
* the legacy TorchScript exporter (``dynamo=False``) traces away the empty-cache and
  single-token branches, so one graph could not serve both prefill and decode.
* the onnxruntime-genai builder emits ``com.microsoft`` ops only, has no ``position_ids`` input,
  needs right padding and knows only some architectures.

Graph interface (b = batch, s = new tokens, p = cached tokens; p may be 0 for prefill)::

    input_ids                    int64   [b, s]
    attention_mask               int64   [b, p + s]   1 = token, 0 = (left) padding
    position_ids                 int64   [b, s]
    past_key_values.{i}.key      float32 [b, kv_heads, p, head_dim]   (and .value)
    -> logits                    float32 [b, s, vocab]
    -> present.{i}.key           float32 [b, kv_heads, p + s, head_dim] (and .value)

A model in half precision (on CUDA, for the FP16 variant) is exported the same way: its cache
tensors are float16, its logits still float32 (one Cast at the end), so every variant's callers
read logits alike.

The weights go to ``model.onnx.data`` beside ``model.onnx`` (always: every exported directory
has the same layout, and models over protobuf's 2 GB limit need no special case).
"""

from __future__ import annotations

import os
import warnings

EXTERNAL_DATA = "model.onnx.data"
INLINE_BYTES = 1024  # smaller tensors stay in model.onnx: onnxruntime reads shape constants there


def input_names(num_layers: int) -> list[str]:
    past = [f"past_key_values.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]
    return ["input_ids", "attention_mask", "position_ids", *past]


def output_names(num_layers: int) -> list[str]:
    return ["logits", *[f"present.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]]


def cache_layout(model) -> list[tuple[int, int]]:
    """(kv_heads, head_dim) of every layer, read from a one-token forward rather than the config
    (configs spell head counts and head_dim in several ways)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    device = next(model.parameters()).device
    with torch.inference_mode():
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), past_key_values=cache, use_cache=True)
    return [(layer.keys.shape[1], layer.keys.shape[3]) for layer in cache.layers]


def decoder_with_cache(model):
    """``model`` wrapped to take and return the cache as plain tensors (see the module docstring)."""
    import torch
    from transformers import DynamicCache

    class DecoderWithCache(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, past):
            cache = DynamicCache(config=self.model.config)
            for i, (key, value) in enumerate(past):
                cache.update(key, value, i)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            presents = []
            for layer in cache.layers:
                presents += [layer.keys, layer.values]
            return (out.logits.float(), *presents)  # a no-op for fp32 models

    return DecoderWithCache(model).eval()


def export_decoder(model, path: str, opset: int = 18) -> dict:
    """Export ``model`` (an HF causal LM in fp32, or fp16 on CUDA) to ``path`` (``.../model.onnx``);
    returns its layout. The sample inputs follow the model's device and dtype."""
    import gc

    import onnx_ir as ir
    import torch
    from torch.export import Dim

    layout = cache_layout(model)
    if len(set(layout)) != 1:
        raise ValueError(f"layers with different cache shapes are not supported: {sorted(set(layout))}")
    num_layers, (kv_heads, head_dim) = len(layout), layout[0]
    weight = next(model.parameters())
    ids = {"dtype": torch.long, "device": weight.device}
    # Sample sizes > 1 and all different, so torch.export keeps every axis symbolic.
    batch, seq, past_len = 2, 3, 5
    sample = (
        torch.ones(batch, seq, **ids),
        torch.ones(batch, past_len + seq, **ids),
        torch.arange(past_len, past_len + seq, **ids).expand(batch, seq).contiguous(),
        [
            tuple(
                torch.zeros(batch, kv_heads, past_len, head_dim, dtype=weight.dtype, device=weight.device) for _ in "kv"
            )
            for _ in range(num_layers)
        ],
    )
    # The mask length (past + seq) gets its own Dim: torch.export rejects a derived one here.
    b, s, p, m = Dim("batch"), Dim("sequence"), Dim("past_sequence"), Dim("total_sequence")
    dynamic_shapes = {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: m},
        "position_ids": {0: b, 1: s},
        "past": [({0: b, 2: p}, {0: b, 2: p}) for _ in range(num_layers)],
    }
    with warnings.catch_warnings():  # "axis name ... will not be used": the input names win, as meant
        warnings.filterwarnings("ignore", message=".*axis name.*", category=UserWarning)
        program = torch.onnx.export(
            decoder_with_cache(model),
            sample,
            dynamo=True,
            opset_version=opset,
            input_names=input_names(num_layers),
            output_names=output_names(num_layers),
            dynamic_shapes=dynamic_shapes,
            optimize=False,
            verbose=False,
        )
    # The weights as the exporter first wrapped them (torch parameters); optimizing folds most into
    # new (transposed) tensors and drops these from the graph, though not from every reference to it.
    weights = list(program.model.graph.initializers.values())
    program.optimize()
    # The exporter stores stack traces and FX node text per node: debug data, local paths, and
    # most of the file on a small model.
    for node in ir.traversal.RecursiveGraphIterator(program.model.graph):
        node.metadata_props.clear()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    ir.save(program.model, path, external_data=EXTERNAL_DATA, size_threshold_bytes=INLINE_BYTES)
    # Drop the graph's hold on the weights (torch parameters, and tensors the optimizer folded), so
    # they are freed with the model: onnxscript's rewrite rules are module globals that keep the
    # last graph they matched alive, with the values it once had.
    for value in [*weights, *program.model.graph.initializers.values()]:
        value.const_value = None
    del program
    gc.collect()
    return {
        "num_layers": num_layers,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": int(model.config.vocab_size),
        "opset": opset,
        "inputs": input_names(num_layers),
        "outputs": output_names(num_layers),
    }
