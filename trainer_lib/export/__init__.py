"""ONNX export of a causal LM with a KV cache, its FP16 and quantized variants and their parity report.

* :mod:`trainer_lib.export.onnx_decoder`: PyTorch -> ONNX decoder with past key/values (FP32, or
  FP16 from a half-precision model on CUDA).
* :mod:`trainer_lib.export.fp16`: FP16 copy of the FP32 graph, with the parts half precision would
  break (rotary angles, RMSNorm statistics, softmax) kept in fp32.
* :mod:`trainer_lib.export.quantize`: INT8 (dynamic, per channel) and INT4 (MatMulNBits) copies,
  onnxruntime's quantizers run on a slice of the graph at a time.
* :mod:`trainer_lib.export.external_data`: weights read from and written to ``model.onnx.data``
  one tensor at a time, so no copy holds all of them in memory.
* :mod:`trainer_lib.export.ort_generate`: ``OrtDecoder``, a numpy + onnxruntime generation loop
  with a KV cache (no torch), shared with the Triton Python backend.
* :mod:`trainer_lib.export.parity`: ONNX vs PyTorch logits, top-1 agreement, greedy exact match,
  file sizes and decode latency.

Nothing heavy is imported here; the ``posttrain export`` stage is :mod:`trainer_lib.stages.lifecycle.export`.
"""
