"""``posttrain deploy rollback``: serve an earlier version of a deployed model again.

    posttrain deploy rollback repository=s3://b/triton model_name=posttrain triton.url=http://triton:8000
    posttrain deploy rollback repository=s3://b/triton model_name=posttrain to_version=3 triton.url=...

Without ``to_version`` the target is the version that served before the current one (the newest
earlier entry of ``deploy.json`` whose files the repository still keeps: ``keep_versions`` of the
deploy stage decides how far back that reaches); rolling back twice returns to where it started.
The switch is made as safely as a deploy's (:mod:`trainer_lib.stages.lifecycle.deploy`), under the
same lock: ``config.pbtxt`` is pointed at the target alone, the server loads it and answers a smoke
request from it; if either fails, the old config is restored and reloaded, the current version keeps
serving and the command exits with an error. The rollback is recorded in ``deploy.json``; the next
deploy still takes a new version number. Without ``triton.url`` only the repository is switched.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

from trainer_lib import storage
from trainer_lib.config import StorageConfig, opt
from trainer_lib.errors import ConfigError, UserError
from trainer_lib.serving import repository as repo
from trainer_lib.stages.lifecycle import deploy
from trainer_lib.stages.lifecycle.deploy import TritonTarget, say

#: deploy.json statuses after which a version served (or was published to serve)
SERVED = ("served", "published", "rolled back to")


@dataclass
class RollbackConfig:
    repository: str | None = opt(None, "Root of the Triton model repository (local dir or URL).")
    model_name: str = opt("posttrain", "The model's name in the repository.")
    to_version: int = opt(0, "The version to serve; 0: the one that served before the current one.")
    triton: TritonTarget = opt(TritonTarget, "The server to load the version on; empty: only switch the repository.")
    smoke_prompt: str = opt("Hello", "Prompt of the smoke request sent to the version.")
    smoke_max_tokens: int = opt(4, "max_tokens of the smoke request.")
    timeout_s: float = opt(300.0, "Seconds to wait for the server to load the version (and per request).")
    lock_wait_s: float = opt(600.0, "Seconds to wait while a deploy or rollback of this model holds its lock.")
    storage: StorageConfig = opt(StorageConfig, "Object store settings.")

    def validate(self) -> None:
        probe = deploy.DeployConfig(
            export=deploy.ExportSource(path="unused"),
            repository=self.repository or "",
            triton=self.triton,
            model_name=self.model_name,
            smoke_max_tokens=self.smoke_max_tokens,
            timeout_s=self.timeout_s,
            lock_wait_s=self.lock_wait_s,
        )
        probe.validate()  # the same rules as the deploy stage's for the keys they share
        if self.to_version < 0:
            raise ConfigError(
                f"to_version: expected a version number >= 1 (0: the previous one), got {self.to_version}"
            )


CONFIG = RollbackConfig


def run(cfg: RollbackConfig) -> dict:
    if not cfg.triton.url:
        return _locked(cfg, None)
    with deploy.live_server(cfg.triton.url, cfg.timeout_s, "nothing was changed") as client:
        return _locked(cfg, client)


def _locked(cfg: RollbackConfig, client) -> dict:
    model_dir = storage.join(cfg.repository, cfg.model_name)
    if not storage.exists(storage.join(model_dir, repo.CONFIG)):  # (checked before the lock, which creates the dir)
        raise UserError(f"repository: {model_dir} has no {repo.CONFIG}: {cfg.model_name} was never deployed there")
    with repo.deploy_lock(model_dir, f"rolling back {cfg.model_name}", cfg.lock_wait_s, say):
        return _switch(cfg, client, model_dir)


def target_version(history: dict, current: int, on_disk: list[int], wanted: int) -> int:
    """The version to serve: ``wanted`` if given, else the newest one that served before ``current`` and is
    still in the repository (``on_disk``); a UserError naming what there is otherwise."""
    if wanted:
        if wanted == current:
            raise UserError(f"to_version: version {wanted} is already the serving one")
        if wanted not in on_disk:
            raise UserError(
                f"to_version: version {wanted} is not in the repository (it keeps {_listed(on_disk)}; "
                f"the deploy stage's keep_versions removes older ones)"
            )
        return wanted
    served = [e["version"] for e in history["versions"] if e.get("status") in SERVED]
    while served and served[-1] == current:
        served.pop()
    for version in reversed(served):
        if version != current and version in on_disk:
            return version
    raise UserError(
        f"no earlier version to roll back to: version {current} serves and the repository keeps {_listed(on_disk)}"
    )


def _listed(versions: list[int]) -> str:
    return ", ".join(map(str, versions)) if versions else "no versions"


def _switch(cfg: RollbackConfig, client, model_dir: str) -> dict:
    old_config = repo.read_config(model_dir)
    if old_config is None:
        raise UserError(f"repository: {model_dir} has no {repo.CONFIG}: {cfg.model_name} was never deployed there")
    history = deploy.read_history(model_dir)
    current = (repo.served_versions(old_config) or [0])[-1]
    target = target_version(history, current, repo.versions(model_dir), cfg.to_version)
    say(f"rolling {cfg.model_name} back from version {current} to version {target} in {cfg.repository}")
    config_path = storage.join(model_dir, repo.CONFIG)
    storage.write_text(config_path, repo.with_versions(old_config, [target]))
    entry = {"version": target, "from": current, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    smoke = None
    if client is not None:
        try:
            failure, smoke = deploy.load_and_check(client, cfg, target)
        except BaseException:  # interrupted mid-switch: the current version back first
            _restore(client, cfg, config_path, old_config)
            raise
        if failure:
            note = _restore(client, cfg, config_path, old_config)
            history["versions"].append({**entry, "status": "rollback failed", "reason": f"{failure[0]}: {failure[1]}"})
            deploy.write_history(model_dir, history)
            raise UserError(
                f"{cfg.model_name} version {target} failed its {failure[0]} ({failure[1]}); "
                f"version {current} still serves{note}"
            )
    history["serving"] = target
    history["versions"].append({**entry, "status": "rolled back to"})
    deploy.write_history(model_dir, history)
    say(f"{cfg.model_name} version {target} is {'serving' if client is not None else 'the published one'}")
    return {
        "stage": "rollback",
        "model_name": cfg.model_name,
        "version": target,
        "previous_version": current,
        "repository": cfg.repository,
        "loaded": client is not None,
        "smoke": smoke,
    }


def _restore(client, cfg: RollbackConfig, config_path: str, old_config: str) -> str:
    """Put the old config back and reload it; a note for the error message if the server refused."""
    storage.write_text(config_path, old_config)
    try:
        repo.load(client, storage.join(cfg.repository, cfg.model_name), cfg.model_name)
    except Exception as exc:
        return f"; restoring the server failed too: {deploy.reason(exc)}"
    return ""


def main(argv: list[str]) -> int:
    """``posttrain deploy rollback [--config FILE ...] [key=value ...]``; prints the summary as JSON."""
    from trainer_lib.config import describe, load_config

    parser = argparse.ArgumentParser(prog="posttrain deploy rollback", add_help=False)
    parser.add_argument("-h", "--help", action="store_true")
    parser.add_argument("--config", action="append", default=[])
    args, overrides = parser.parse_known_args(argv)
    if args.help:
        print("usage: posttrain deploy rollback [--config FILE ...] [key=value ...]\n")
        print("Serve the version that served before the current one (or to_version) again, load and smoke-test it.")
        print("\noptions (YAML keys, or key=value on the command line):")
        rows = describe(RollbackConfig)
        width = max(len(key) for key, _, _ in rows) + 2
        for key, default, text in rows:
            print(f"  {key.ljust(width)}{text} [default: {default}]")
        return 0
    bad = [o for o in overrides if o.startswith("-")]
    if bad:
        print(f"error: unknown option {bad[0]} (see posttrain deploy rollback --help)", file=sys.stderr)
        return 2
    cfg = load_config(RollbackConfig, args.config, overrides)
    storage.configure(endpoint_url=cfg.storage.endpoint_url, region=cfg.storage.region, cache_dir=cfg.storage.cache_dir)
    print(json.dumps(run(cfg), indent=2, default=str))
    return 0
