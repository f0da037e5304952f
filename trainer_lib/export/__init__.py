"""ONNX export of a causal LM with a KV cache, its quantized variants and their parity report.

* :mod:`trainer_lib.export.onnx_decoder`: PyTorch -> FP32 ONNX decoder with past key/values.
* :mod:`trainer_lib.export.quantize`: INT8 (dynamic, per channel) and INT4 (MatMulNBits) copies.
* :mod:`trainer_lib.export.ort_generate`: ``OrtDecoder``, a numpy + onnxruntime generation loop
  with a KV cache (no torch), shared with the Triton Python backend.
* :mod:`trainer_lib.export.parity`: ONNX vs PyTorch logits, top-1 agreement, greedy exact match,
  file sizes and decode latency.

Nothing heavy is imported here; the ``posttrain export`` stage is :mod:`trainer_lib.stages.lifecycle.export`.
"""
