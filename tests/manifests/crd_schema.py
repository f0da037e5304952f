"""A TrainJob checked as the API server checks it on create: against the Trainer CRD's OpenAPI schema.

``crds/trainjob-v2.3.0.schema.json`` is the schema of kubeflow/trainer v2.3.0 (the version
tests/crd_fields.py pins): ``spec.versions[0].schema.openAPIV3Schema`` of its
``manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml`` without the ``description`` keys, written with
``json.dumps(..., indent=1, sort_keys=True)`` and a ``$comment`` naming the source.

The launcher creates TrainJobs with ``fieldValidation=Strict``, so a field the schema does not list is
an error, as here: every object schema with ``properties`` is closed unless it preserves unknown fields.
Types, patterns (quantities), required keys and list sizes are checked by ``jsonschema``; the CRD's CEL
rules are not (on create they only check the name, which tests/crd_fields.py ``TRAINJOB_NAME`` covers,
and ``managedBy``, which we never set).
"""

from __future__ import annotations

import functools
import json
import os

import jsonschema

SCHEMA = os.path.join(os.path.dirname(__file__), "crds", "trainjob-v2.3.0.schema.json")


def strict(schema):
    """The schema with every object that lists its properties closed to others (Strict field validation)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out:
        if not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    return out


@functools.cache
def _validator() -> jsonschema.Draft7Validator:
    with open(SCHEMA, encoding="utf-8") as fh:
        schema = strict(json.load(fh))
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def schema_errors(validator: jsonschema.Draft7Validator, document: dict) -> list[str]:
    """What ``validator`` refuses in ``document``, one sorted ``path: message`` each (empty: it accepts it)."""
    return sorted(
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(document)
    )


def trainjob_errors(job: dict) -> list[str]:
    """What the API server would refuse in ``job``, one ``path: message`` each (empty: it would accept it)."""
    return schema_errors(_validator(), job)
