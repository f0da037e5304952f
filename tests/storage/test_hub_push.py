"""hub.push (push_to_hub / hub_model_id / hub_private_repo): the final model reaches a hub repo.

The hub is a stand-in on 127.0.0.1 (tests/http_helpers.py) answering the endpoints huggingface_hub's
``create_repo`` and ``upload_folder`` call: repo creation, preupload (regular or LFS per file), the
LFS batch API with a basic PUT upload and its verify call, and the NDJSON commit. huggingface.co's
default transfer for large files, Xet storage (``hf_xet``), cannot be stood in here: the tests turn it
off (huggingface_hub's ``HF_HUB_DISABLE_XET``), so large files take the Git LFS path.
"""

import base64
import hashlib
import json
import os

import pytest

from tests.http_helpers import serving
from trainer_lib.cli import main
from trainer_lib.config import load_config
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.stages.training.sft import SFTConfig
from trainer_lib.storage.hub import push_folder

CANARY = "hf_posttrainHubCanary0123456789abcdXYZ"
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".png")  # as the hub's default .gitattributes routes them


class HubStandIn:
    """Just enough of the hub API for create_repo + upload_folder; ``repos`` holds what was committed."""

    def __init__(self, refuse_create: bool = False):
        self.refuse_create = refuse_create
        self.repos: dict[str, dict[str, bytes]] = {}  # repo id -> path -> content
        self.created: list[dict] = []
        self.lfs: dict[str, bytes] = {}  # oid -> content PUT
        self.commits: list[list[dict]] = []

    def handle(self, request):
        base = f"http://{request.headers['host']}"
        path, parts = request.path, request.path.strip("/").split("/")
        if path.startswith("/lfs/") and request.method == "PUT":  # a presigned upload URL: no token sent
            oid = parts[1]
            if hashlib.sha256(request.body).hexdigest() != oid:
                return 400, {"error": "content does not match the oid"}
            self.lfs[oid] = request.body
            return 200, {}
        if request.headers.get("authorization") != f"Bearer {CANARY}":
            return 401, {"error": "Invalid credentials in Authorization header"}
        if path == "/api/repos/create":
            if self.refuse_create:
                return 403, {"error": "You don't have the rights to create a model under this namespace"}
            payload = request.json()
            self.created.append(payload)
            repo = f"{payload['organization']}/{payload['name']}"
            self.repos.setdefault(repo, {})
            return 200, {"url": f"{base}/{repo}"}
        if path.startswith("/api/models/") and request.method == "GET":  # repo_info, after a refused create
            return 404, {"error": "Repository not found"}
        if path.startswith("/api/models/") and parts[4] == "preupload":
            files = request.json()["files"]
            modes = [{"path": f["path"], "uploadMode": self.mode(f), "shouldIgnore": False} for f in files]
            return 200, {"files": modes}
        if path.endswith(".git/info/lfs/objects/batch"):
            objects = request.json()["objects"]
            actions = {"upload": {"href": f"{base}/lfs/{{}}"}, "verify": {"href": f"{base}/api/lfs-verify"}}
            return 200, {
                "transfer": "basic",
                "objects": [
                    {**o, "actions": {k: {"href": a["href"].format(o["oid"])} for k, a in actions.items()}}
                    for o in objects
                ],
            }
        if path == "/api/lfs-verify":
            body = request.json()
            return (200, {}) if len(self.lfs.get(body["oid"], b"")) == body["size"] else (404, {"error": "no such oid"})
        if path.startswith("/api/models/") and parts[4] == "commit":
            return self.commit("/".join(parts[2:4]), request.body, base)
        return 404, {"error": f"no stand-in for {request.method} {path}"}

    @staticmethod
    def mode(file: dict) -> str:
        return "lfs" if file["path"].endswith(LFS_SUFFIXES) or file["size"] > 10_000_000 else "regular"

    def commit(self, repo: str, body: bytes, base: str):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        self.commits.append(lines)
        for line in lines[1:]:
            value = line["value"]
            if line["key"] == "file":
                self.repos[repo][value["path"]] = base64.b64decode(value["content"])
            elif line["key"] == "lfsFile":
                if value["oid"] not in self.lfs:
                    return 400, {"error": f"{value['path']}: LFS object {value['oid']} was never uploaded"}
                self.repos[repo][value["path"]] = self.lfs[value["oid"]]
        return 200, {"commitUrl": f"{base}/{repo}/commit/0123abcd", "commitOid": "0123abcd"}


@pytest.fixture
def hub(monkeypatch):
    """The stand-in, with HF_ENDPOINT and HF_TOKEN pointing at it, and Xet off (see the module docstring)."""
    from huggingface_hub import constants

    app = HubStandIn()
    with serving(app) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", CANARY)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        server.hub = app
        yield server
    assert not server.errors, server.errors


def _files(root) -> dict[str, bytes]:
    out = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            out[os.path.relpath(path, root).replace(os.sep, "/")] = open(path, "rb").read()
    return out


def test_an_sft_run_pushes_its_model_and_never_writes_the_token(hub, tiny_model_dir, chat_jsonl, tmp_path, capsys):
    out = tmp_path / "sft"
    args = [
        "sft",
        f"model.path={tiny_model_dir}",
        f"data.path={chat_jsonl}",
        f"output_dir={out}",
        "max_steps=2",
        "batch_size=4",
        "data.max_length=64",
        "save_steps=2",  # one checkpoint, under output_dir: not uploaded
        "logging_steps=1",
        "report_to=tensorboard",
        "push_to_hub=true",  # TRL's names
        "hub_model_id=me/tiny-sft",
        "hub_private_repo=true",
    ]
    assert main(args) == 0
    assert main([*args, "--print-config"]) == 0
    printed = capsys.readouterr()
    assert "sft: hub.push: uploaded output_dir to me/tiny-sft (http://127.0.0.1:" in printed.out
    assert hub.hub.created == [{"name": "tiny-sft", "organization": "me", "visibility": "private", "type": "model"}]
    written = _files(out)
    assert any(path.startswith("checkpoints/step-00000002/") for path in written)
    expected = {path: data for path, data in written.items() if not path.startswith("checkpoints/")}
    received = hub.hub.repos["me/tiny-sft"]
    assert sorted(received) == sorted(expected) and received == expected  # names and bytes
    assert {"model.safetensors", "config.json", "tokenizer.json", "summary.json", "metrics.jsonl"} <= set(received)
    assert any(path.startswith("tensorboard/") for path in received)
    assert not any(path.endswith(".png") for path in written)  # loss_plot is off
    commit = hub.hub.commits[0]
    assert commit[0]["value"]["summary"] == "posttrain sft: 2 steps"
    lfs = {line["value"]["path"] for line in commit if line["key"] == "lfsFile"}
    assert lfs == {"model.safetensors"} and received["model.safetensors"] == written["model.safetensors"]
    assert all(r.headers.get("authorization") == f"Bearer {CANARY}" for r in hub.requests if r.path.startswith("/api"))
    assert CANARY not in printed.out + printed.err
    leaked = [path for path, data in written.items() if CANARY.encode() in data]
    assert not leaked  # model, checkpoints, metrics, summary, TensorBoard events
    assert not [path for path, data in received.items() if CANARY.encode() in data]


REQUIRED = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "output_dir": "out"}


def test_push_without_a_token_or_a_repo_fails_before_training(monkeypatch, tmp_path):
    from huggingface_hub import constants

    from trainer_lib.runner.stage_api import run_config

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))  # no `hf auth login` file
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # the config is fine where a pipeline is submitted from (the token lives on the cluster)...
    cfg = load_config(SFTConfig, [{**REQUIRED, "hub": {"push": True, "model_id": "me/model"}}])
    # ...and the stage refuses to start without one, before it reads the (missing) model
    with pytest.raises(ConfigError, match=r"hub.push: no Hugging Face token: export HF_TOKEN .* me/model"):
        run_config("sft", cfg)
    with pytest.raises(ConfigError, match=r"hub.push: needs hub.model_id.* \(set by push_to_hub\)"):
        load_config(SFTConfig, [{**REQUIRED, "push_to_hub": True}])
    with pytest.raises(ConfigError, match="hub.model_id: expected user/name or org/name, got 'a/b/c'"):
        load_config(SFTConfig, [{**REQUIRED, "push_to_hub": True, "hub_model_id": "a/b/c"}])
    monkeypatch.setenv("HF_TOKEN", CANARY)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    cfg = load_config(SFTConfig, [{**REQUIRED, "push_to_hub": True, "hub_model_id": "me/model"}])
    with pytest.raises(ConfigError, match="hub.push: HF_HUB_OFFLINE is set"):
        run_config("sft", cfg)
    cfg = load_config(SFTConfig, [{**REQUIRED, "push_to_hub": False, "hub_model_id": "me/model"}])
    assert (cfg.hub.push, cfg.hub.model_id, cfg.hub.private) == (False, "me/model", False)


def test_a_refused_upload_names_the_repo_and_not_the_token(hub, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    hub.hub.refuse_create = True
    with pytest.raises(UserError) as exc:
        push_folder(str(folder), "someone-else/model")
    message = str(exc.value)
    assert message.startswith(f"hub.push: uploading {folder} to {hub.url}/someone-else/model failed: ")
    assert "hf upload someone-else/model" in message and CANARY not in message
    hub.hub.refuse_create = False
    assert push_folder(str(folder), "me/model").endswith("/me/model/commit/0123abcd")
    assert hub.hub.repos["me/model"] == {"config.json": b"{}"}
