"""DeepSpeed loads without mlflow (its autotuner imports it at import time), and mlflow still loads after."""

import subprocess
import sys

CODE = """
import sys
from trainer_lib.engine.strategy import import_deepspeed
deepspeed = import_deepspeed()
print("loaded:", "deepspeed" in sys.modules, "mlflow" in sys.modules)
import mlflow
print("then:", mlflow.__name__)
"""


def test_deepspeed_imports_without_mlflow_and_mlflow_still_imports():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True).stdout
    ours = [line for line in out.splitlines() if line.startswith(("loaded:", "then:"))]  # (DeepSpeed prints too)
    assert ours == ["loaded: True False", "then: mlflow"]
