"""The stages around training: prepare (data), evaluate (metrics, report, gate), release (a gated model),
export (ONNX, INT8, INT4, parity) and deploy (a Triton model repository, loaded and smoke-tested)."""
