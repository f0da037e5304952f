"""A tiny GGUF file written from a tiny Hugging Face Llama, as llama.cpp's converter writes one.

The tensors get llama.cpp's names (``token_embd.weight``, ``blk.N.attn_q.weight``...), the query and key
projections llama.cpp's row order (transformers undoes it when it reads the file), the byte-level BPE
tokenizer goes in as ``tokenizer.ggml.*`` metadata with its chat template. The embedding is stored as
Q8_0 blocks, so reading the file dequantizes, as a real quantized file does; the rest stays F32.
"""

from __future__ import annotations

import json
import os

#: the per-layer tensors: llama.cpp's name -> the Hugging Face module under ``model.layers.N``
LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def llama_cpp_rows(weight, heads: int):
    """A query or key projection in llama.cpp's row order (its converter's ``permute``): per head, the
    rotary halves interleaved."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_tiny_gguf(hf_dir: str, path: str, architecture: str = "llama") -> str:
    """Write the tiny Llama in ``hf_dir`` (config, model.safetensors, tokenizer.json) to ``path`` as GGUF;
    ``architecture`` is what the file says it is (another name makes a file transformers cannot read)."""
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as fh:
        config = json.load(fh)
    weights = load_file(os.path.join(hf_dir, "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_name("tiny-llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config["hidden_size"] // heads)
    writer.add_rope_freq_base(float((config.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])
    add_tokenizer(writer, hf_dir)

    embedding = weights["model.embed_tokens.weight"]
    writer.add_tensor(
        "token_embd.weight",
        gguf.quants.quantize(embedding, gguf.GGMLQuantizationType.Q8_0),
        raw_dtype=gguf.GGMLQuantizationType.Q8_0,
    )
    for layer in range(config["num_hidden_layers"]):
        for short, module in LAYER_TENSORS.items():
            tensor = weights[f"model.layers.{layer}.{module}.weight"]
            if short == "attn_q":
                tensor = llama_cpp_rows(tensor, heads)
            elif short == "attn_k":
                tensor = llama_cpp_rows(tensor, kv_heads)
            writer.add_tensor(f"blk.{layer}.{short}.weight", np.ascontiguousarray(tensor, dtype=np.float32))
    writer.add_tensor("output_norm.weight", weights["model.norm.weight"].astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer, hf_dir: str) -> None:
    """The byte-level BPE of ``hf_dir``'s tokenizer.json as ``tokenizer.ggml.*`` metadata, with its special
    tokens (CONTROL), eos and pad ids and chat template."""
    with open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8") as fh:
        spec = json.load(fh)
    vocab = dict(spec["model"]["vocab"])
    special = {added["content"]: added["id"] for added in spec["added_tokens"]}
    vocab.update(special)
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [merge if isinstance(merge, str) else " ".join(merge) for merge in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token in special else 1 for token in tokens])  # 3: CONTROL, 1: NORMAL
    writer.add_token_merges(merges)
    writer.add_eos_token_id(special["<|im_end|>"])
    writer.add_pad_token_id(special["<|pad|>"])
    with open(os.path.join(hf_dir, "chat_template.jinja"), encoding="utf-8") as fh:
        writer.add_chat_template(fh.read())
