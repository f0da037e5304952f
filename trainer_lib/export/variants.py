"""Which exported variant a server runs and the gate judges: the one asked for, or ``auto``.

The export stage writes the variants whose parity held and lists them in ``export.json``'s ``models``;
those that did not hold are measured, left out and listed under ``failed`` with the figure
(``trainer_lib/stages/lifecycle/export.py``). Evaluate (``served.variant``) and deploy (``variant``)
resolve what they were asked for here, once, before any work:

* a variant the export wrote: itself;
* a variant the export left out: a UserError naming it and why (the run stops, it does not serve a
  model that failed its parity);
* ``auto``: the smallest variant written (by its files' size) among those a CPU serves (int4, int8,
  fp32), so a model whose INT8 did not hold is served in the next smallest form that did, on the same
  kind of machine. FP16 is for GPUs (onnxruntime's CPU provider lacks half kernels for most of the
  graph, and Triton places it on a GPU): it is served only when asked for by name. FP32 is always
  written (the export fails without its parity), so ``auto`` always finds one.
"""

from __future__ import annotations

import json

from trainer_lib import storage
from trainer_lib.errors import UserError

AUTO = "auto"
#: the variants an export can write, and what deploy and evaluate may be asked for
VARIANTS = ("int8", "fp32", "fp16", "int4")
CHOICES = (*VARIANTS, AUTO)
#: the variant ``auto`` never picks: it needs a GPU
GPU_ONLY = "fp16"


def read_summary(export_dir: str, key: str) -> dict:
    """The ``export.json`` of an export stage's ``export_dir`` (local or URL); errors name ``key``."""
    marker = storage.join(export_dir, "export.json")
    if not storage.exists(marker):
        raise UserError(
            f"{key}: {export_dir} has no export.json; expected an export stage's output_dir "
            "(export.json, onnx/<variant>/, tokenizer/)"
        )
    try:
        summary = json.loads(storage.read_text(marker))
    except ValueError as exc:
        raise UserError(f"{key}: {marker} is not JSON ({exc})") from None
    models = summary.get("models") if isinstance(summary, dict) else None
    if not isinstance(models, dict) or not models:
        raise UserError(f"{key}: {marker} lists no models; expected {{variant: 'onnx/<variant>/model.onnx'}}")
    return summary


def pick(summary: dict, asked: str, key: str) -> str:
    """The variant of the export ``summary`` that ``asked`` names (see the module doc); errors name ``key``."""
    models, failed = summary["models"], summary.get("failed") or {}
    if asked == AUTO:
        sizes = summary.get("file_bytes") or {}
        served_on_cpu = [name for name in models if name != GPU_ONLY]
        if not served_on_cpu:
            raise UserError(f"{key}: {AUTO} picks a variant a CPU serves, and the export wrote only {GPU_ONLY}")
        return min(served_on_cpu, key=lambda name: (sizes.get(name, float("inf")), VARIANTS.index(name)))
    if asked in failed:
        raise UserError(
            f"{key}: the export left {asked} out because it failed its parity ({failed[asked]}); "
            f"serve one it wrote ({', '.join(models)}), or {AUTO} for the smallest of them"
        )
    if asked not in models:
        raise UserError(
            f"{key}: {asked!r} is not in the export (it has {', '.join(models)}); pick one of those, {AUTO}, "
            "or export it (int4=true for int4)"
        )
    return asked


def resolve(export_dir: str, asked: str, key: str, dir_key: str) -> str:
    """:func:`pick` on the export at ``export_dir``; errors name ``key`` (the variant's) or ``dir_key``."""
    return pick(read_summary(export_dir, dir_key), asked, key)
