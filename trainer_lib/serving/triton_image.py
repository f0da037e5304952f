"""The Triton serving image (images/Dockerfile.triton): NVIDIA's Triton Inference Server with what the
generate model's ``model.py`` imports (onnxruntime-gpu, tokenizers, numpy), tagged with the package
version like the training image (``components.common.IMAGE``).

manifests/triton and manifests/kserve run it; tests/images/test_triton_image.py keeps ``VERSION``
equal to pyproject.toml's and ``REGISTRY`` next to the training image's.
"""

#: Where ``make image-triton`` tags the image: the training image's registry path with ``-triton``.
REGISTRY = "ghcr.io/posttrain/posttrain-triton"
#: The package version (pyproject.toml, ``components.common.VERSION``).
VERSION = "0.1.0"
IMAGE = f"{REGISTRY}:{VERSION}"
