"""posttrain pipeline: compile, run locally, submit or schedule the Kubeflow pipelines.

    posttrain pipeline list
    posttrain pipeline compile [--out DIR] [--check] [--target all|kfp|argo]
    posttrain pipeline run [--pipeline NAME] [--root DIR] [--latest DIR] [param=value ...]
    posttrain pipeline submit --host URL [--pipeline NAME] [--experiment E] [param=value ...]
    posttrain pipeline schedule --host URL --cron "0 3 * * 0" [--pipeline NAME] [param=value ...]

Parameters are the pipeline's inputs (``posttrain pipeline list`` shows them), typed from the
pipeline signature. Errors in names or values exit with code 2 before anything starts.
"""

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import sys
import tempfile
import warnings

from trainer_lib.errors import ConfigError
from trainer_lib.values import parse_bool

DEFAULT_PIPELINE = "posttrain-sft"
COMPILED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compiled")
ARGO_SUBDIR = "argo"  # compile --target argo: Argo WorkflowTemplates in COMPILED_DIR/argo
DEFAULT_ROOT = os.path.join("runs", "local")


class UsageError(Exception):
    """A bad pipeline name, parameter or option; exit code 2."""


# --------------------------------------------------------------------------- registry and parameters


def pipelines() -> dict:
    from pipelines.dag import PIPELINES

    return PIPELINES


def get_pipeline(name: str):
    found = pipelines()
    if name not in found:
        raise UsageError(f"unknown pipeline '{name}'; expected one of: {', '.join(sorted(found))}")
    return found[name]


def _typed(name: str, kind: str, raw: str, previous):
    """Convert one ``name=raw`` argument to the parameter's type."""
    if kind == "String":
        if raw.startswith("@"):  # name=@file.yaml reads the value from a file
            try:
                with open(raw[1:], encoding="utf-8") as fh:
                    return fh.read()
            except OSError as exc:
                raise UsageError(f"{name}: cannot read {raw[1:]}: {exc.strerror}") from None
        return raw
    if kind == "Integer":
        if re.fullmatch(r"[+-]?\d+", raw.strip()):
            return int(raw)
        raise UsageError(f"{name}: expected an integer, got '{raw}'")
    if kind == "Float":
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"{name}: expected a number, got '{raw}'") from None
    if kind == "Boolean":
        try:
            return parse_bool(raw, name)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    if kind in ("List", "Dict"):
        if kind == "List" and not raw.lstrip().startswith("["):
            return [*(previous or []), raw]  # repeat name=item to build a list of strings
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{name}: expected JSON, got '{raw}' ({exc.msg})") from None
        if not isinstance(value, list if kind == "List" else dict):
            raise UsageError(f"{name}: expected a JSON {kind.lower()}, got '{raw}'")
        return value
    return raw


def parse_params(pipeline, items: list[str]) -> dict:
    """``["sft_max_steps=3", "sft_overrides=lora.r=8"]`` -> typed arguments of ``pipeline``. A renamed
    parameter's old name (``lr`` of posttrain-sft) still works, with a warning; giving both names is an error."""
    from components.parameters import SEARCH_FILES

    inputs = pipeline.component_spec.inputs or {}
    params: dict = {}
    given = [item.split("=", 1)[0].strip() for item in items]
    for item in items:
        if "=" not in item or item.startswith("="):
            raise UsageError(f"'{item}': expected param=value (see 'posttrain pipeline list')")
        name, raw = item.split("=", 1)
        name = new_name(pipeline.name, name.strip(), given)
        if name not in inputs:
            raise UsageError(f"unknown parameter '{name}' of {pipeline.name}; expected one of: {', '.join(inputs)}")
        params[name] = _typed(name, inputs[name].type, raw, params.get(name))
    return {name: one_line_search(name, value) if name in SEARCH_FILES else value for name, value in params.items()}


def one_line_search(name: str, text: str) -> str:
    """A search file's YAML or JSON text as one line of JSON without a single quote: kfp.local and Argo put a
    ``dsl.If`` condition's text values, quoted, into the expression they evaluate, where a line break or a
    quote would end it (and kfp.local would skip both branches). Empty stays empty: no search."""
    if not text.strip():
        return ""
    from trainer_lib.runner.tune.pipeline_search import read_search_text

    try:
        values = read_search_text(text)
    except ConfigError as exc:
        raise UsageError(f"{name}: {str(exc).removeprefix('search: ')}") from None
    return json.dumps(values, sort_keys=True, default=str).replace("'", "\\u0027")


def new_name(pipeline: str, name: str, given: list[str]) -> str:
    """``name``, or the new name of a parameter ``pipeline`` renamed (pipelines.dag.RENAMED), with a warning.
    ``given``: every name on the command line, where the new name must not be too."""
    from pipelines.dag import RENAMED

    new = RENAMED.get(pipeline, {}).get(name)
    if new is None:
        return name
    if new in given:
        raise UsageError(
            f"{pipeline}: both {name} and {new} given: {name} is the deprecated name of {new}; give {new} only"
        )
    print(f"warning: {pipeline}: parameter {name} is deprecated, use {new}", file=sys.stderr)
    return new


def check_stages(pipeline, params: dict) -> None:
    """Every stage config the run would build, checked here first (a UsageError names task and key)."""
    from pipelines.validate import ValidationError, validate

    try:
        validate(pipeline, params)
    except ValidationError as exc:
        raise UsageError(f"{pipeline.name}: {exc}") from None


# --------------------------------------------------------------------------- compile


def compile_all(out_dir: str) -> list[str]:
    """Write ``<name>.yaml`` for every pipeline into ``out_dir``; returns the paths."""
    from kfp import compiler

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, pipeline in sorted(pipelines().items()):
        path = os.path.join(out_dir, f"{name}.yaml")
        compiler.Compiler().compile(pipeline, path)
        paths.append(path)
    return paths


def _read(path: str) -> bytes | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as fh:
        return fh.read()


def compile_targets(out_dir: str, target: str = "all") -> list[str]:
    """KFP IR (``<name>.yaml``) and/or Argo WorkflowTemplates (``argo/<name>.yaml``, translated from that
    IR by pipelines/argo.py) into ``out_dir``; returns the paths."""
    paths = compile_all(out_dir) if target in ("kfp", "all") else []
    if target in ("argo", "all"):
        from pipelines.argo import write_all

        with tempfile.TemporaryDirectory() as tmp:
            kfp_dir = out_dir if target == "all" else tmp
            if target == "argo":
                compile_all(tmp)
            paths += write_all(kfp_dir, os.path.join(out_dir, ARGO_SUBDIR))
    return paths


def cmd_compile(args) -> int:
    if not args.check:
        for path in compile_targets(args.out, args.target):
            print(f"wrote {path}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        drift = []
        fresh_paths = compile_targets(tmp, args.target)
        for fresh in fresh_paths:
            committed = os.path.join(args.out, os.path.relpath(fresh, tmp))
            if _read(fresh) != _read(committed):
                drift.append(committed)
        argo_dir = os.path.join(args.out, ARGO_SUBDIR)
        if args.target in ("argo", "all") and os.path.isdir(argo_dir):  # a template of a pipeline now gone
            made = {os.path.relpath(p, tmp) for p in fresh_paths}
            drift += [
                os.path.join(argo_dir, f)
                for f in sorted(os.listdir(argo_dir))
                if f.endswith(".yaml") and os.path.join(ARGO_SUBDIR, f) not in made
            ]
    for path in drift:
        print(f"out of date: {path}", file=sys.stderr)
    if drift:
        print("run 'posttrain pipeline compile' and commit the result", file=sys.stderr)
        return 1
    print(f"compiled pipelines in {args.out} are up to date")
    return 0


# --------------------------------------------------------------------------- local run


def cmd_run(args) -> int:
    pipeline = get_pipeline(args.pipeline)
    params = parse_params(pipeline, args.params)
    check_stages(pipeline, params)
    root = os.path.abspath(args.root)
    latest = os.path.abspath(args.latest or os.path.join(os.path.dirname(root), "latest"))
    check_latest(latest)  # before the run, not after it
    os.makedirs(root, exist_ok=True)

    from kfp import local

    if args.runner == "docker":
        from pipelines.containers import docker_runner, host_paths, run_on_cpu

        if args.cpu_only:
            run_on_cpu(pipeline)
        params, paths = host_paths(params)
        runner = docker_runner(root, os.path.abspath(args.cache), paths)
    else:
        runner = local.SubprocessRunner(use_venv=False)
    local.init(runner=runner, pipeline_root=root)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    try:
        with warnings.catch_warnings():
            # our image is a Python one (kfp.local guesses from its name it may not be), and
            # resources/Kubernetes settings are known to apply on a cluster only
            warnings.filterwarnings("ignore", message=".*non-Python base image")
            warnings.filterwarnings("ignore", message=".*have no effect in the current local runner")
            task = pipeline(**params)
    except RuntimeError as exc:  # kfp.local raises when a task fails; its log is above
        print(f"error: pipeline {pipeline.name} failed: {exc}", file=sys.stderr)
        return 1
    defaults = {k: v.default for k, v in (pipeline.component_spec.inputs or {}).items()}
    record = run_record(pipeline.name, root, shown_params({**defaults, **params}), started, task.outputs)
    if args.runner == "docker":
        from pipelines.containers import container_records

        record["containers"] = container_records(record["run_dir"]) if record["run_dir"] else {}
    write_latest(latest, record)
    print(f"\npipeline {pipeline.name} succeeded; run directory: {record['run_dir']}")
    for name, out in record["outputs"].items():
        print(f"  {name}: {out['path']}")
        for key, value in sorted(out["metadata"].items()):
            print(f"      {key} = {value}")
    for task_name, outputs in record["tasks"].items():
        print(f"  {task_name}: " + ", ".join(sorted(outputs)))
    if record.get("evaluation"):
        print(
            f"evaluation: {latest}/metrics.json and {latest}/report.html "
            f"(gate {'passed' if record['evaluation']['gate_passed'] else 'FAILED'})"
        )
    print(f"latest run: {latest}/run.json")
    return 0


def _run_dir(root: str, name: str, started: float) -> str | None:
    """kfp.local writes each run to ``{root}/{pipeline}-{timestamp}``: the newest one of ours."""
    runs = [os.path.join(root, d) for d in os.listdir(root) if d.startswith(f"{name}-")]
    runs = [d for d in runs if os.path.isdir(d) and os.path.getmtime(d) >= started - 1]
    return max(runs, key=os.path.getmtime) if runs else None


def _task_outputs(run_dir: str | None) -> dict:
    """``{task: {output: path}}`` for every task that ran (skipped branches leave no directory); the
    executor's own files (its output message, a container run's record) are not outputs."""
    from pipelines.containers import RECORD

    if not run_dir:
        return {}
    tasks = {}
    for task in sorted(os.listdir(run_dir)):
        folder = os.path.join(run_dir, task)
        if os.path.isdir(folder):
            kept = [o for o in sorted(os.listdir(folder)) if o not in ("executor_output.json", RECORD)]
            tasks[task] = {o: os.path.join(folder, o) for o in kept}
    return tasks


def shown_params(params: dict) -> dict:
    """``params`` as run.json may keep them: a webhook URL shows only its scheme and host (its path usually
    holds the token)."""
    from trainer_lib.release.notify import public

    hook = params.get("notify_webhook")
    return {**params, "notify_webhook": f"{public(hook)}/***"} if hook else params


def _train_outputs(tasks: dict) -> dict:
    """The model and metrics of the run's one training task (``posttrain-sft``: KFP takes no pipeline outputs
    from inside the DAG's ExitHandler), with their metadata; empty when the run trained more than one."""
    trained = [name for name, outputs in tasks.items() if name.startswith("train") and "output_model" in outputs]
    if len(trained) != 1:
        return {}
    folder = os.path.dirname(tasks[trained[0]]["output_model"])
    try:  # (a Metrics artifact is only metadata: kfp.local keeps it in the executor output, with no file)
        with open(os.path.join(folder, "executor_output.json"), encoding="utf-8") as fh:
            written = json.load(fh).get("artifacts", {})
    except (OSError, ValueError):
        written = {}
    found = {}
    for name, key, kind in (("model", "output_model", "system.Model"), ("metrics", "metrics", "system.Metrics")):
        artifacts = (written.get(key) or {}).get("artifacts") or []
        if key in tasks[trained[0]] or artifacts:
            metadata = artifacts[0].get("metadata", {}) if artifacts else {}
            found[name] = {"path": os.path.join(folder, key), "type": kind, "metadata": metadata}
    return found


def run_record(name: str, root: str, params: dict, started: str, outputs: dict) -> dict:
    """What ``runs/latest/run.json`` holds: where every output and task output of this run is."""
    start = datetime.datetime.fromisoformat(started).timestamp()
    run_dir = _run_dir(root, name, start)
    record = {
        "pipeline": name,
        "run_dir": run_dir,
        "started": started,
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
        "parameters": params,
        "outputs": {},
        "tasks": _task_outputs(run_dir),
    }
    results = [
        t["results"]
        for task, t in record["tasks"].items()
        if task.startswith("evaluate") and os.path.isfile(os.path.join(t.get("results", ""), "metrics.json"))
    ]
    if results:
        with open(os.path.join(results[0], "metrics.json"), encoding="utf-8") as fh:
            gate = json.load(fh).get("gate", {})
        record["evaluation"] = {"results": results[0], "gate_passed": bool(gate.get("passed"))}
    for out_name, artifact in sorted(outputs.items()):
        path = os.path.abspath(artifact.path)
        record["outputs"][out_name] = {
            "path": path,
            "type": artifact.schema_title,
            "metadata": dict(artifact.metadata or {}),
        }
        # outputs land at {root}/{pipeline}-{timestamp}/{task}/{output}
        record["run_dir"] = record["run_dir"] or os.path.join(root, os.path.relpath(path, root).split(os.sep)[0])
    if not outputs:
        record["outputs"] = _train_outputs(record["tasks"])
    return record


def check_latest(latest: str) -> None:
    """Only a link, an empty directory or an earlier ``latest`` (with run.json) is replaced."""
    if os.path.islink(latest) or not os.path.exists(latest):
        return
    if os.path.isdir(latest) and (not os.listdir(latest) or os.path.isfile(os.path.join(latest, "run.json"))):
        return
    raise UsageError(f"--latest: {latest} exists and is not an earlier run record; refusing to replace it")


def served_paths(record: dict) -> dict:
    """Where this run's Triton repository, export and exported HF model are (those that exist)."""
    paths = {}
    for task, outputs in sorted(record.get("tasks", {}).items()):
        repository, exported = outputs.get("repository", ""), outputs.get("exported", "")
        if task.startswith("deploy") and os.path.isdir(repository) and os.listdir(repository):
            paths.setdefault("repository", repository)
        if task.startswith("export") and os.path.isfile(os.path.join(exported, "export.json")):
            paths.setdefault("exported", exported)
            with open(os.path.join(exported, "export.json"), encoding="utf-8") as fh:
                paths.setdefault("exported_model", json.load(fh)["model_path"])
    return paths


def write_latest(latest: str, record: dict) -> None:
    """Replace ``latest`` with a directory holding run.json and a link per output directory."""
    parent = os.path.dirname(latest)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".latest-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it 0700
    with open(os.path.join(tmp, "run.json"), "w", encoding="utf-8") as fh:
        json.dump(record, fh, indent=2, default=str)
        fh.write("\n")
    for name, out in record["outputs"].items():
        if os.path.exists(out["path"]):
            os.symlink(out["path"], os.path.join(tmp, name))
    for name, target in served_paths(record).items():  # runs/latest/repository, exported, exported_model
        os.symlink(target, os.path.join(tmp, name))
    if record.get("evaluation"):  # runs/latest/metrics.json (with its `models` map) and report.html
        for name in ("metrics.json", "report.html", "summary.md"):
            src = os.path.join(record["evaluation"]["results"], name)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(tmp, name))
    if os.path.islink(latest):
        os.remove(latest)
    elif os.path.isdir(latest):
        shutil.rmtree(latest)
    os.rename(tmp, latest)


# --------------------------------------------------------------------------- cluster


def _check_host(host: str) -> str:
    if not re.match(r"^https?://[^\s/]+", host or ""):
        raise UsageError(f"--host: expected the KFP API URL like http://localhost:8080, got '{host}'")
    return host.rstrip("/")


def kfp_cron(cron: str) -> str:
    """KFP wants 6 cron fields (seconds first); a standard 5-field expression gets '0' seconds."""
    fields = cron.split()
    if len(fields) not in (5, 6) or not all(re.fullmatch(r"[\w*/,\-?#LW]+", f) for f in fields):
        raise UsageError(f"--cron: expected 5 fields (min hour day month weekday) or 6 (seconds first), got '{cron}'")
    return " ".join(["0", *fields] if len(fields) == 5 else fields)


class ServerError(Exception):
    """The KFP API refused a request or could not be reached; exit code 1."""


@contextlib.contextmanager
def _kfp_errors(host: str):
    """A KFP API error or an unreachable host becomes one line naming the host, not a traceback."""
    import urllib3
    from kfp_server_api.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        try:
            detail = json.loads(exc.body or "{}").get("message") or exc.reason
        except (ValueError, AttributeError):
            detail = exc.body or exc.reason
        raise ServerError(f"the KFP API at {host} answered HTTP {exc.status}: {detail}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise ServerError(f"cannot reach the KFP API at {host}: {getattr(exc, 'reason', None) or exc}") from None


def _client(args):
    import kfp

    extra = {"namespace": args.namespace} if args.namespace else {}
    return kfp.Client(host=args.host, existing_token=os.environ.get("KFP_TOKEN"), **extra)


def _package(pipeline, tmp: str, no_cache: bool = False) -> str:
    """Compile ``pipeline`` fresh (the code is the source of truth) into ``tmp``.

    ``no_cache`` turns caching off for every task, those inside sub-pipelines and conditions
    included: kfp.Client's ``enable_caching=False`` reaches only the root DAG's tasks.
    """
    import yaml
    from kfp import compiler

    path = os.path.join(tmp, f"{pipeline.name}.yaml")
    compiler.Compiler().compile(pipeline, path)
    if no_cache:
        with open(path, encoding="utf-8") as fh:
            spec, *platform = list(yaml.safe_load_all(fh))
        dags = [spec["root"]] + list(spec.get("components", {}).values())
        for task in (t for dag in dags for t in (dag.get("dag") or {}).get("tasks", {}).values()):
            task["cachingOptions"] = {**task.get("cachingOptions", {}), "enableCache": False}
        with open(path, "w", encoding="utf-8") as fh:
            yaml.safe_dump_all([spec, *platform], fh, sort_keys=False)
    return path


def cmd_submit(args) -> int:
    args.host = _check_host(args.host)
    pipeline = get_pipeline(args.pipeline)
    params = parse_params(pipeline, args.params)
    check_stages(pipeline, params)
    with tempfile.TemporaryDirectory() as tmp, _kfp_errors(args.host):
        result = _client(args).create_run_from_pipeline_package(
            _package(pipeline, tmp, args.no_cache),
            arguments=params,
            run_name=args.run_name or f"{pipeline.name} {datetime.datetime.now():%Y-%m-%d %H:%M:%S}",
            experiment_name=args.experiment,
            namespace=args.namespace,
            service_account=args.service_account,
        )
    print(f"submitted {pipeline.name} run {result.run_id}")
    print(f"run: {args.host}/#/runs/details/{result.run_id}")
    return 0


def cmd_schedule(args) -> int:
    args.host = _check_host(args.host)
    cron = kfp_cron(args.cron)
    pipeline = get_pipeline(args.pipeline)
    params = parse_params(pipeline, args.params)
    if "skip_if_unchanged" in (pipeline.component_spec.inputs or {}) and "skip_if_unchanged" not in params:
        params["skip_if_unchanged"] = True  # a scheduled run retrains only when its inputs changed
        print("skip_if_unchanged=true: runs stop early when nothing changed since the latest release")
    check_stages(pipeline, params)
    if args.max_concurrency < 1:
        raise UsageError(f"--max-concurrency: expected >= 1, got {args.max_concurrency}")
    with tempfile.TemporaryDirectory() as tmp, _kfp_errors(args.host):
        client = _client(args)
        experiment = client.create_experiment(args.experiment, namespace=args.namespace)
        job = client.create_recurring_run(
            experiment_id=experiment.experiment_id,
            job_name=args.job_name or f"{pipeline.name} ({args.cron})",
            cron_expression=cron,
            max_concurrency=args.max_concurrency,
            no_catchup=True,
            params=params,
            pipeline_package_path=_package(pipeline, tmp, args.no_cache),
            service_account=args.service_account,
        )
    print(f"scheduled {pipeline.name} with cron '{cron}' as recurring run {job.recurring_run_id}")
    print(f"recurring run: {args.host}/#/recurringrun/details/{job.recurring_run_id}")
    return 0


def cmd_list(args) -> int:
    for name, pipeline in sorted(pipelines().items()):
        spec = pipeline.component_spec
        print(f"{name}: {spec.description or ''}\n  parameters (param=value; name, type, default):")
        for key, inp in (spec.inputs or {}).items():
            print(f"    {key:<19}{inp.type:<8}{json.dumps(inp.default):<8}{inp.description or ''}")
        print(f"  outputs: {', '.join(spec.outputs or {})}\n")
    return 0


# --------------------------------------------------------------------------- argparse


PARAMS_HELP = (
    "pipeline parameters as param=value (see 'posttrain pipeline list'); list parameters "
    "take a JSON list or repeat param=item; string parameters read a file with param=@FILE"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="posttrain pipeline",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'posttrain pipeline <command> --help' for its options.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{list,compile,run,submit,schedule}")

    sub.add_parser("list", help="List the pipelines with their parameters and defaults.")

    p = sub.add_parser(
        "compile", help="Write <name>.yaml (KFP IR) and argo/<name>.yaml (Argo WorkflowTemplate) for every pipeline."
    )
    p.add_argument("--out", default=COMPILED_DIR, help="output directory (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="exit 1 if the files in --out differ from a fresh compile")
    p.add_argument(
        "--target",
        choices=("all", "kfp", "argo"),
        default="all",
        help="kfp: KFP IR; argo: Argo WorkflowTemplates for clusters without Kubeflow Pipelines, in OUT/argo "
        "(translated from the KFP IR); all: both (default: %(default)s)",
    )

    p = sub.add_parser("run", help="Run a pipeline locally with kfp.local (subprocesses or containers).")
    p.add_argument("--pipeline", default=DEFAULT_PIPELINE, help="pipeline name (default: %(default)s)")
    p.add_argument(
        "--root", default=DEFAULT_ROOT, help="outputs go to ROOT/<pipeline>-<time>/<task> (default: %(default)s)"
    )
    p.add_argument("--latest", help="directory linking this run's outputs (default: 'latest' next to --root)")
    p.add_argument(
        "--runner",
        choices=("subprocess", "docker"),
        default="subprocess",
        help="subprocess: every task in this venv; docker: every task in its image, through Docker or podman's "
        "Docker API ($DOCKER_HOST), with the settings of pipelines/settings.py (default: %(default)s)",
    )
    p.add_argument("--cpu-only", action="store_true", help="with --runner docker: GPU tasks run in the CPU image")
    p.add_argument(
        "--cache",
        default=os.path.join("runs", "container-cache"),
        help="with --runner docker: the tasks' shared "
        "cache folder, mounted where a cluster mounts its cache volume (default: %(default)s)",
    )
    p.add_argument("params", nargs="*", metavar="param=value", help=PARAMS_HELP)

    for command, text in (
        ("submit", "Submit one run to a Kubeflow Pipelines server."),
        ("schedule", "Create a recurring (cron) run on a Kubeflow Pipelines server."),
    ):
        p = sub.add_parser(command, help=text)
        p.add_argument(
            "--host",
            required=True,
            help="KFP API URL, e.g. http://localhost:8080 (a bearer token is read from $KFP_TOKEN if set)",
        )
        p.add_argument("--pipeline", default=DEFAULT_PIPELINE, help="pipeline name (default: %(default)s)")
        p.add_argument("--experiment", default="posttrain", help="experiment name (default: %(default)s)")
        p.add_argument("--namespace", help="Kubeflow profile namespace (multi-user installs)")
        p.add_argument("--service-account", help="Kubernetes service account the run's pods use")
        p.add_argument("--no-cache", action="store_true", help="disable KFP caching for this run")
        if command == "submit":
            p.add_argument("--run-name", help="run name (default: pipeline name and time)")
        else:
            p.add_argument(
                "--cron",
                required=True,
                help="cron schedule: 5 fields 'min hour day month weekday' (e.g. '0 3 * * 0', "
                "Sundays 03:00) or KFP's 6 fields with seconds first",
            )
            p.add_argument("--job-name", help="recurring run name (default: pipeline name and cron)")
            p.add_argument(
                "--max-concurrency",
                type=int,
                default=1,
                help="runs of this schedule allowed at once (default: %(default)s)",
            )
        p.add_argument("params", nargs="*", metavar="param=value", help=PARAMS_HELP)
    return parser


COMMANDS = {"list": cmd_list, "compile": cmd_compile, "run": cmd_run, "submit": cmd_submit, "schedule": cmd_schedule}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    if not args.command:
        parser.print_help()
        return 0
    try:
        return COMMANDS[args.command](args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def posttrain(argv: list[str] | None = None) -> int:
    """The ``posttrain`` console command: the library's stages and commands, plus ``posttrain pipeline``.

    It lives here, in the top layer, so that ``trainer_lib`` never imports the pipelines.
    """
    from trainer_lib.cli import COMMANDS
    from trainer_lib.cli import main as library_main

    pipeline = ("Compile, run locally, submit or schedule the Kubeflow pipelines.", main)
    tune = (COMMANDS["tune"][0], tune_main)
    return library_main(argv, extra_commands={"pipeline": pipeline, "tune": tune})


def tune_main(argv: list[str]) -> int:
    """``posttrain tune``, with our images and GPU pods (components/common.py) for ``--target katib``."""
    from components.common import CUDA_IMAGE, IMAGE, training_node
    from trainer_lib.runner.tune.katib_experiment import ClusterDefaults
    from trainer_lib.runner.tune.tune_cli import main as tune

    return tune(argv, cluster=ClusterDefaults(IMAGE, CUDA_IMAGE, training_node))


if __name__ == "__main__":
    sys.exit(main())
