"""The built CPU image, run by its engine: ``make test-images`` builds it and runs these (docs/development.md).

Skipped unless ``POSTTRAIN_TEST_IMAGE`` names a built image (and ``POSTTRAIN_CONTAINER_ENGINE`` the
engine, default podman): image builds take minutes and do not belong in ``make test``. Every container
runs as the image's user, with a read-only root, no network and a tmpfs /tmp, as a locked-down pod would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE = os.environ.get("POSTTRAIN_TEST_IMAGE", "")
ENGINE = os.environ.get("POSTTRAIN_CONTAINER_ENGINE", "podman")

pytestmark = pytest.mark.skipif(not IMAGE, reason="POSTTRAIN_TEST_IMAGE is not set (make test-images)")


def engine_env() -> dict:
    env = dict(os.environ)
    if ENGINE == "podman":
        env["CONTAINERS_CONF"] = os.path.join(ROOT, "images", "podman.conf")
    return env


@pytest.fixture
def docker_env(tmp_path):
    """The environment in which the Docker SDK reaches the engine: with podman, its Docker API on a socket of
    this test's (``DOCKER_HOST``), served for the test's length; with Docker, as it is."""
    env = engine_env()
    if ENGINE != "podman":
        yield env
        return
    socket_path = tmp_path / "podman.sock"
    service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{socket_path}"], env=env)
    env["DOCKER_HOST"] = f"unix://{socket_path}"
    for _ in range(30):
        if socket_path.exists():
            break
        time.sleep(1)
    try:
        yield env
    finally:
        service.terminate()
        service.wait(timeout=30)


def run_in_image(
    *args: str, mounts: tuple[tuple[str, str], ...] = (), options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    volumes = [arg for host, inside in mounts for arg in ("-v", f"{host}:{inside}:ro")]
    command = [ENGINE, "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none", *options, *volumes]
    command += [IMAGE, *args]
    return subprocess.run(command, capture_output=True, text=True, env=engine_env(), timeout=600)


def test_the_image_records_the_commit_it_was_built_from():
    out = run_in_image("cat", "/etc/posttrain/build.json")
    assert out.returncode == 0, out.stderr
    build = json.loads(out.stdout)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert build["commit"] == head.stdout.strip()
    assert build["dirty"] in ("true", "false") and build["image"]


def test_a_stage_runs_in_the_image_as_its_user(tmp_path):
    """``posttrain prepare`` on a data file of the repo: the user is uid 1000, the output lands in a mount."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out_dir.chmod(0o777)  # the container's uid 1000 writes here
    data, source = os.path.join(ROOT, "tests", "data", "foreign", "trl", "data"), "capybara.jsonl"  # TRL's SFT rows
    command = [ENGINE, "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none"]
    command += ["-v", f"{data}:/data:ro", "-v", f"{out_dir}:/out", IMAGE]
    command += ["sh", "-c", f"id -u && posttrain prepare data.path=/data/{source} output_dir=/out/prepared"]
    out = subprocess.run(command, capture_output=True, text=True, env=engine_env(), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[0] == "1000"
    written = sorted(p.name for p in (out_dir / "prepared").iterdir())
    assert written, "prepare wrote nothing"


def test_the_cpu_image_holds_no_cuda_packages():
    out = run_in_image("python3", "-m", "pip", "list", "--format=freeze")
    assert out.returncode == 0, out.stderr
    names = [line.split("==")[0].lower() for line in out.stdout.splitlines()]
    cuda = [n for n in names if n.startswith(("nvidia-", "cuda-")) or n == "triton"]  # triton: CUDA torch's compiler
    assert "torch" in names and not cuda, cuda
    assert "torch==2.13.0+cpu" in out.stdout.splitlines()


#: A seccomp profile that refuses namespaces, as a pod's RuntimeDefault profile does without CAP_SYS_ADMIN.
NO_NAMESPACES = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["unshare", "setns"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
}


@pytest.mark.parametrize("namespaces", ["allowed", "refused"])
def test_a_hostile_program_is_contained_by_the_sandbox_in_the_image(tmp_path, namespaces):
    """HumanEval's sandbox where the evaluation runs: no secret read, no socket, no write outside its
    scratch space, no signal to the evaluator, whichever isolation the container lets it use: namespaces
    where the container allows them, else the fallback (a seccomp profile refusing unshare)."""
    canary = f"canary-{uuid.uuid4().hex}"
    secret = tmp_path / "token"
    secret.write_text(canary)
    secret.chmod(0o644)  # readable by the evaluator (uid 1000), as a mounted token is
    probe = os.path.join(ROOT, "tests", "images", "container_probe.py")
    profile = tmp_path / "seccomp.json"
    profile.write_text(json.dumps(NO_NAMESPACES))
    out = run_in_image(
        "python3",
        "/probe/container_probe.py",
        "/var/run/secrets/posttrain/token",
        mounts=((probe, "/probe/container_probe.py"), (str(secret), "/var/run/secrets/posttrain/token")),
        options=("--security-opt", f"seccomp={profile}") if namespaces == "refused" else (),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["uid"] == 1000
    markers = ("LEAKED", "CONNECTED", "WROTE")
    for name, result in report["results"].items():
        assert not any(marker in result["output"] for marker in markers), (name, result)
        assert canary not in result["output"] + result["detail"], name
    # in a PID namespace kill() may succeed on the program's own namespace: what counts is that none arrived
    assert report["signals"] == 0 and report["written"] == []
    # which mechanism held is reported (namespaces where the container allows them, else the fallback)
    assert set(report["isolation"]) >= {"network", "filesystem", "user", "chroot"}
    if namespaces == "refused":
        assert not report["isolation"]["network"] and not report["isolation"]["filesystem"]
    print("isolation in the image:", report["isolation"])


#: Bodies of ``add(a, b)`` for ``posttrain humaneval``: the first is honest; each other one returns the right sum
#: only when its escape works, so a hostile sample passes exactly when it got out.
HOSTILE_COMPLETIONS = {
    "honest": "    return a + b\n",
    "read_secret": (
        "    try:\n        leaked = open('/var/run/secrets/posttrain/token').read()\n"
        "    except OSError:\n        return None\n    print('LEAKED', leaked)\n    return a + b\n"
    ),
    "write_results": (
        "    try:\n        open('/out/escaped', 'w').write('x')\n    except OSError:\n        return None\n"
        "    return a + b\n"
    ),
    "kill_evaluator": (
        "    import os, signal\n    try:\n        os.kill(1, signal.SIGKILL)\n        os.killpg(0, signal.SIGKILL)\n"
        "    except OSError:\n        return None\n    return a + b\n"
    ),
}


def test_hostile_humaneval_completions_are_contained_when_evaluated_in_the_image(tmp_path):
    """``posttrain humaneval`` in the image, as PID 1 of a locked-down container with a mounted token and a
    writable results folder: the honest completion passes, the hostile ones (read the token, write into the
    results folder, kill the evaluator) fail, the token appears nowhere, and the evaluator finishes."""
    canary = f"canary-{uuid.uuid4().hex}"
    secret = tmp_path / "token"
    secret.write_text(canary)
    secret.chmod(0o644)  # readable by the evaluator (uid 1000), as a mounted token is
    data, out_dir = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    out_dir.mkdir()
    out_dir.chmod(0o777)  # the container's uid 1000 writes here
    problem = {
        "task_id": "Probe/0",
        "prompt": "def add(a, b):\n",
        "entry_point": "add",
        "canonical_solution": "    return a + b\n",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    }
    (data / "problems.jsonl").write_text(json.dumps(problem) + "\n")
    samples = [{"task_id": "Probe/0", "completion": body} for body in HOSTILE_COMPLETIONS.values()]
    (data / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in samples))
    command = [ENGINE, "run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none"]
    command += [
        "-v",
        f"{data}:/data:ro",
        "-v",
        f"{out_dir}:/out",
        "-v",
        f"{secret}:/var/run/secrets/posttrain/token:ro",
    ]
    command += [IMAGE, "posttrain", "humaneval", "--samples", "/data/samples.jsonl", "--problems"]
    command += ["/data/problems.jsonl", "--out", "/out/results", "--k", "1", "--workers", "1"]
    out = subprocess.run(command, capture_output=True, text=True, env=engine_env(), timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    with open(out_dir / "results" / "samples.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    passed = {name: row["passed"] for name, row in zip(HOSTILE_COMPLETIONS, rows)}
    assert passed == {name: name == "honest" for name in HOSTILE_COMPLETIONS}, [r["result"] for r in rows]
    assert not (out_dir / "escaped").exists()
    written = "".join(path.read_text() for path in (out_dir / "results").iterdir())
    assert canary not in written + out.stdout + out.stderr


def test_a_pipeline_runs_with_every_task_in_the_image_and_records_it(tmp_path, docker_env):
    """posttrain-sft (a few SFT steps on the embedded default) with --runner docker --cpu-only: every task ran
    in the built image, and each task's executor output folder records that image's id as the engine knows it
    and the commit it was built from (HEAD); run.json gathers the records."""
    run = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "posttrain"), "pipeline", "run"]
        + ["--pipeline", "posttrain-sft", "--runner", "docker", "--cpu-only", "--root", str(tmp_path / "runs")]
        + ["--cache", str(tmp_path / "cache"), "sft_max_steps=5", 'demo_overrides=["n_code_train=100"]'],
        capture_output=True,
        text=True,
        env=docker_env,
        timeout=1200,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    started = run.stdout.count(f"Found image '{IMAGE}'")
    assert started >= 8  # check-config ... notify, each in a container
    with open(tmp_path / "latest" / "run.json", encoding="utf-8") as fh:
        record = json.load(fh)
    run_dir = record["run_dir"]
    outputs = sorted(
        os.path.relpath(folder, run_dir) for folder, _, files in os.walk(run_dir) if "executor_output.json" in files
    )
    assert sorted(record["containers"]) == sorted(
        os.path.relpath(folder, run_dir) for folder, _, files in os.walk(run_dir) if "container.json" in files
    )
    assert set(outputs) <= set(record["containers"]) and len(record["containers"]) == started
    engine_id = subprocess.run(
        [ENGINE, "image", "inspect", "--format", "{{.Id}}", IMAGE], capture_output=True, text=True, env=engine_env()
    ).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    for task, task_record in record["containers"].items():
        with open(os.path.join(run_dir, task, "container.json"), encoding="utf-8") as fh:
            assert json.load(fh) == task_record, task
        assert task_record["image"] == IMAGE, task
        assert task_record["image_id"].removeprefix("sha256:") == engine_id.removeprefix("sha256:"), task
        assert task_record["build"]["commit"] == head.stdout.strip(), task


def test_a_failing_task_container_reports_its_exit_status(docker_env):
    """kfp.local 2.17's own runner reports success when the container is gone before it asks (podman
    removes it at once): ours returns the status, so a failed task fails the pipeline."""
    import docker

    from pipelines.containers import run_container

    client = docker.from_env(environment=docker_env)
    try:
        assert run_container(client, IMAGE, ["sh", "-c", "echo failing; exit 3"], {}) == 3
        assert run_container(client, IMAGE, ["true"], {}) == 0
    finally:
        client.close()
