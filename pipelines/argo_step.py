"""Run one KFP lightweight component inside an Argo Workflows step, without Kubeflow Pipelines.

The Argo templates that ``posttrain pipeline compile --target argo`` writes run the component source
KFP embeds in its IR (the same text, the same function) through this module instead of KFP's
``kfp.dsl.executor_main``. KFP's driver hands the executor one JSON document (``--executor_input``); Argo
hands a step its parameters as arguments and its artifacts as files. This module builds that JSON from
Argo's side and runs KFP's own ``Executor``, so parameter types, artifacts and outputs behave as under KFP:

    python -m pipelines.argo_step --component_module_path FILE --function_to_execute NAME
        --io-root /tmp/argo
        --parameter NAME:TYPE VALUE ...        (TYPE: the IR's parameterType, e.g. STRING, LIST)
        --input-artifact NAME:SCHEMA ...       (an Argo input artifact at IO_ROOT/inputs/NAME)
        --output-artifact NAME:SCHEMA ...      (written to IO_ROOT/outputs/NAME)
        --output-parameter NAME ...            (written to IO_ROOT/outputs/parameters/NAME)
        --final-status NAME STATE FAILURES WORKFLOW TASK   (a PipelineTaskFinalStatus, exit handlers)

An artifact travels through Argo's artifact repository as a directory: ``data`` (the file or folder
the component wrote at ``artifact.path``) and ``metadata.json`` (``artifact.metadata``, which KFP keeps
in its metadata store and components read downstream, e.g. where a source dataset lives).
"""

import argparse
import json
import os
import sys
import tempfile

IO_ROOT = "/tmp/argo"
#: Argo's workflow phases -> KFP's final task states.
ARGO_TO_KFP_STATE = {"Succeeded": "SUCCEEDED", "Failed": "FAILED", "Error": "FAILED"}


def parse_value(name: str, kind: str, raw: str):
    """One Argo parameter (always text) -> the JSON value KFP would hand the executor for ``kind``."""
    try:
        if kind == "STRING":
            return raw
        if kind == "NUMBER_INTEGER":
            return int(raw)
        if kind == "NUMBER_DOUBLE":
            return float(raw)
        if kind == "BOOLEAN":
            if raw.strip().lower() not in ("true", "false"):
                raise ValueError("expected true or false")
            return raw.strip().lower() == "true"
        if kind in ("LIST", "STRUCT"):
            value = json.loads(raw)
            if not isinstance(value, list if kind == "LIST" else dict):
                raise ValueError(f"expected a JSON {'list' if kind == 'LIST' else 'object'}")
            return value
    except ValueError as exc:
        raise SystemExit(f"argo_step: parameter '{name}' ({kind}): cannot read {raw!r}: {exc}") from None
    raise SystemExit(f"argo_step: parameter '{name}': unknown parameter type {kind}")


def _artifact(name: str, schema: str, folder: str, with_metadata: bool) -> dict:
    metadata = {}
    meta_path = os.path.join(folder, "metadata.json")
    if with_metadata and os.path.isfile(meta_path):
        with open(meta_path, encoding="utf-8") as fh:
            metadata = json.load(fh)
    uri = os.path.join(folder, "data")
    return {"artifacts": [{"name": name, "type": {"schemaTitle": schema}, "uri": uri, "metadata": metadata}]}


def executor_input(args, work_dir: str) -> dict:
    """The ExecutorInput KFP's driver would have built for this step."""
    inputs = os.path.join(args.io_root, "inputs")
    outputs = os.path.join(args.io_root, "outputs")
    values = {}
    for spec, raw in args.parameter:
        name, kind = spec.split(":", 1)
        values[name] = parse_value(name, kind, raw)
    for name, state, failures, workflow, task in args.final_status:
        values[name] = {
            "state": ARGO_TO_KFP_STATE.get(state, state.upper()),
            "pipelineJobResourceName": workflow,
            "pipelineTaskName": task,
            "error": {"code": 0 if state == "Succeeded" else 2, "message": "" if state == "Succeeded" else failures},
        }
    artifacts = {}
    for spec in args.input_artifact:
        name, schema = spec.split(":", 1)
        folder = os.path.join(inputs, name)
        if os.path.exists(folder):  # an optional input the task was not given stays absent
            artifacts[name] = _artifact(name, schema, folder, with_metadata=True)
    out_artifacts = {}
    for spec in args.output_artifact:
        name, schema = spec.split(":", 1)
        os.makedirs(os.path.join(outputs, name), exist_ok=True)
        out_artifacts[name] = _artifact(name, schema, os.path.join(outputs, name), with_metadata=False)
    out_parameters = {n: {"outputFile": os.path.join(outputs, "parameters", n)} for n in args.output_parameter}
    return {
        "inputs": {"parameterValues": values, "artifacts": artifacts},
        "outputs": {
            "parameters": out_parameters,
            "artifacts": out_artifacts,
            "outputFile": os.path.join(work_dir, "executor_output.json"),
        },
    }


def write_outputs(executor: dict, output_file: str | None) -> None:
    """What KFP's executor wrote to executor_output.json, as Argo reads it: each output parameter as a
    file (text as is, anything else as JSON, so a bool reads ``true``), each artifact's metadata beside it."""
    written = {}
    if output_file and os.path.isfile(output_file):
        with open(output_file, encoding="utf-8") as fh:
            written = json.load(fh)
    values = written.get("parameterValues", {})
    for name, entry in executor["outputs"]["parameters"].items():
        if name not in values:
            raise SystemExit(f"argo_step: the component returned no value for its output '{name}'")
        os.makedirs(os.path.dirname(entry["outputFile"]), exist_ok=True)
        with open(entry["outputFile"], "w", encoding="utf-8") as fh:
            value = values[name]
            fh.write(value if isinstance(value, str) else json.dumps(value))
    for name, entry in executor["outputs"]["artifacts"].items():
        found = written.get("artifacts", {}).get(name, {}).get("artifacts") or entry["artifacts"]
        folder = os.path.dirname(entry["artifacts"][0]["uri"])
        with open(os.path.join(folder, "metadata.json"), "w", encoding="utf-8") as fh:
            json.dump(found[0].get("metadata", {}), fh, indent=2, sort_keys=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.argo_step", description=__doc__.split("\n")[0])
    p.add_argument("--component_module_path", required=True, help="file holding the component function")
    p.add_argument("--function_to_execute", required=True, help="name of the component function")
    p.add_argument("--io-root", default=IO_ROOT, help="folder of Argo's inputs/ and outputs/ (default: %(default)s)")
    p.add_argument("--parameter", nargs=2, action="append", default=[], metavar=("NAME:TYPE", "VALUE"))
    p.add_argument("--input-artifact", action="append", default=[], metavar="NAME:SCHEMA")
    p.add_argument("--output-artifact", action="append", default=[], metavar="NAME:SCHEMA")
    p.add_argument("--output-parameter", action="append", default=[], metavar="NAME")
    p.add_argument(
        "--final-status", nargs=5, action="append", default=[], metavar=("NAME", "STATE", "FAILURES", "WF", "TASK")
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("_KFP_RUNTIME", "true")  # as KFP's own launcher sets it
    from kfp.dsl import executor as kfp_executor
    from kfp.dsl import utils

    module_dir, module_file = os.path.split(os.path.abspath(args.component_module_path))
    module = utils.load_module(module_name=module_file.removesuffix(".py"), module_directory=module_dir)
    function = getattr(module, args.function_to_execute)
    with tempfile.TemporaryDirectory() as work_dir:
        executor = executor_input(args, work_dir)
        output_file = kfp_executor.Executor(executor_input=executor, function_to_execute=function).execute()
        write_outputs(executor, output_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
