"""Fixtures for the serving tests: an export directory of the tiny model, and the Triton environment."""

from __future__ import annotations

import pytest

from tests.serving.helpers import make_export_dir


@pytest.fixture(scope="session")
def export_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The export stage's layout (onnx/fp32, onnx/int8, tokenizer/, parity.json) for the tiny model."""
    return make_export_dir(tiny_model_dir, str(tmp_path_factory.mktemp("export")))


@pytest.fixture(scope="session")
def triton_env() -> str:
    """The Triton environment (make triton-env); without one the server cannot start: skip."""
    from trainer_lib.errors import UserError
    from trainer_lib.serving.server import find_env

    try:
        return find_env()
    except UserError as exc:
        pytest.skip(f"tritonserver cannot start: {exc}")
