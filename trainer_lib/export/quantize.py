"""INT8 and INT4 copies of an exported FP32 decoder (onnxruntime.quantization, weights only).

* INT8: ``quantize_dynamic`` with int8 weights, one scale per output channel; activations are
  quantized on the fly per call (no calibration data). ``embeddings=True`` quantizes the
  embedding ``Gather`` too: on small models the vocabulary table is most of the weights.
* INT4: ``MatMulNBitsQuantizer`` (symmetric, blocks of 32 along the input dim), weight-only
  ``com.microsoft.MatMulNBits``; needs the ``onnx-ir`` package. Embeddings stay FP32 (4-bit
  Gather would force opset 21).

Both outputs keep the FP32 graph's inputs and outputs and, like the FP32 export, keep their
weights in ``model.onnx.data``.
"""

from __future__ import annotations

import os
import tempfile

from trainer_lib.export.onnx_decoder import EXTERNAL_DATA, INLINE_BYTES


def fold_transposed_weights(model) -> int:
    """Replace ``Transpose(initializer)`` nodes by a transposed initializer; returns how many.

    A tied LM head is exported as ``MatMul(h, Transpose(embedding))``; the quantizers only touch
    MatMuls whose weight is an initializer, so without this the head (often the largest
    matrix) would stay FP32.
    """
    import numpy as np
    from onnx import numpy_helper

    weights = {t.name: t for t in model.graph.initializer}
    folded = []
    for node in model.graph.node:
        if node.op_type != "Transpose" or node.input[0] not in weights:
            continue
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        array = np.transpose(numpy_helper.to_array(weights[node.input[0]]), perm)
        model.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array), node.output[0]))
        folded.append(node)
    for node in folded:
        model.graph.node.remove(node)
    return len(folded)


def save_model(model, path: str) -> None:
    """Write ``model`` to ``path``, its initializers over 1 KiB in ``model.onnx.data`` beside it."""
    import onnx
    from onnx.external_data_helper import convert_model_to_external_data

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = os.path.join(os.path.dirname(os.path.abspath(path)), EXTERNAL_DATA)
    for old in (path, data):  # onnx appends to an existing data file
        if os.path.exists(old):
            os.remove(old)
    convert_model_to_external_data(
        model, all_tensors_to_one_file=True, location=EXTERNAL_DATA, size_threshold=INLINE_BYTES
    )
    onnx.save_model(model, path)
    os.chmod(data, 0o644)  # onnx creates it owner-only; a serving container may run as another user


def quantize_int8(fp32_path: str, out_path: str, embeddings: bool = True) -> None:
    """``fp32_path`` -> ``out_path``: int8 per-channel MatMul weights (and Gather if ``embeddings``)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model = onnx.load(fp32_path)
    fold_transposed_weights(model)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(out_path))) as tmp:
        # quantize_dynamic only writes files (owner-only, its own inline threshold): re-save ours.
        # reduce_range: 7-bit weights. On x86 CPUs without VNNI (AVX2 only) onnxruntime's u8 x s8 kernel
        # (VPMADDUBSW) saturates its 16-bit sums; full-range weights then cost top-1 agreement (0.867
        # against PyTorch on such a machine, where VNNI machines gave >= 0.9).
        quantize_dynamic(
            model,
            os.path.join(tmp, "model.onnx"),
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=True,
            op_types_to_quantize=["MatMul", "Gather"] if embeddings else ["MatMul"],
            use_external_data_format=True,
        )
        save_model(onnx.load(os.path.join(tmp, "model.onnx")), out_path)


def quantize_int4(fp32_path: str, out_path: str, block_size: int = 32) -> None:
    """``fp32_path`` -> ``out_path``: 4-bit block-quantized MatMul weights (``MatMulNBits``)."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(fp32_path)
    fold_transposed_weights(model)
    quantizer = MatMulNBitsQuantizer(model, bits=4, block_size=block_size, is_symmetric=True)
    quantizer.process()
    save_model(quantizer.model.model, out_path)
