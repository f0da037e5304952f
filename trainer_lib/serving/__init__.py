"""Serving the exported model with Triton Inference Server.

* :mod:`~trainer_lib.serving.repository`: write a versioned Triton model repository (local or URL)
  that NVIDIA's images and KServe read as is: the text-generation model on the Python backend
  (``text_input`` -> ``text_output``) and, optionally, the raw ONNX decoder.
* :mod:`~trainer_lib.serving.triton_generate_model`: the ``model.py`` copied into each version; on a
  GPU instance it picks onnxruntime's TensorRT, CUDA or CPU provider.
* :mod:`~trainer_lib.serving.triton_image`: the name and tag of the Triton serving image
  (images/Dockerfile.triton) that the manifests run.
* :mod:`~trainer_lib.serving.server`: find and run a local ``tritonserver`` (``posttrain serve``).
* :mod:`~trainer_lib.serving.client`: one generate request over HTTP (deploy's smoke test, tests).

Nothing is imported here, so ``import trainer_lib.serving`` stays cheap.
"""
