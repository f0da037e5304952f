"""The laptop's side of config validation: ``posttrain pipeline run|submit|schedule`` check every stage
config of the compiled pipeline before anything runs or is sent (the walk is
:func:`components.validation.check_spec`, which the cluster's first task runs too)."""

from __future__ import annotations

from components.validation import ValidationError

__all__ = ["ValidationError", "validate"]


def validate(pipeline, params: dict) -> int:
    """Build every stage config ``pipeline`` would run with ``params`` (defaults filled in); raises
    :class:`ValidationError` naming the task, stage and key. Returns how many configs were checked."""
    from google.protobuf import json_format

    from components.validation import check_spec

    return check_spec(json_format.MessageToDict(pipeline.pipeline_spec), params)
