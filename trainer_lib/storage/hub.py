"""Publishing a finished model to a Hugging Face hub model repo (``hub.push``), as ``push_to_hub`` does in
transformers: the repo is created if it does not exist, then the folder is uploaded in one commit.

The hub is ``$HF_ENDPOINT`` (read when the upload starts, so a private hub mirror works), else
huggingface.co. The token is huggingface_hub's own (``$HF_TOKEN``, else the file ``hf auth login``
wrote); it travels only in the Authorization header of the hub's requests, and errors are redacted
(:func:`trainer_lib.storage.redact`) before they are raised. Large files go the way huggingface_hub
sends them to that hub (Xet storage when ``hf_xet`` is installed, else Git LFS); small ones go inside
the commit itself.
"""

from __future__ import annotations

import os
import re

from trainer_lib.errors import UserError
from trainer_lib.storage.base import redact

#: a hub repo id: ``name`` (the token's user) or ``namespace/name``, the hub's own rule for the characters.
REPO_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def hub_token() -> str | None:
    """The token huggingface_hub would send, or None when there is none."""
    from huggingface_hub import get_token

    return get_token()


def hub_endpoint() -> str:
    """The hub uploads go to: ``$HF_ENDPOINT`` now, else the one huggingface_hub was imported with."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def check_ready(model_id: str) -> None:
    """Before training, on the machine that trains: a token to upload with and no offline mode."""
    from huggingface_hub import constants

    from trainer_lib.errors import ConfigError

    if constants.is_offline_mode():
        raise ConfigError("hub.push: HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it or turn it off")
    if not hub_token():
        raise ConfigError(
            f"hub.push: no Hugging Face token: export HF_TOKEN (a token with write access to {model_id}) "
            "or run `hf auth login`; a token never goes in the config"
        )


def push_folder(
    folder: str,
    repo_id: str,
    *,
    private: bool = False,
    commit_message: str = "Upload model",
    ignore_patterns: list[str] | None = None,
) -> str:
    """Create the model repo ``repo_id`` (kept if it exists: its visibility too) and upload every file of
    the local ``folder`` but ``ignore_patterns`` (fnmatch patterns of paths relative to it) in one
    commit; returns the commit's URL. ``private`` makes a new repo private (otherwise the namespace's
    default). A failure is a :class:`~trainer_lib.errors.UserError` naming the repo, without the token."""
    from huggingface_hub import HfApi

    token = hub_token()
    if not token:
        raise UserError(
            f"hub.push: no Hugging Face token to upload to {repo_id} with: export HF_TOKEN (a token with write access)"
        )
    endpoint = hub_endpoint()
    api = HfApi(endpoint=endpoint, token=token)
    try:
        repo = api.create_repo(repo_id, repo_type="model", private=True if private else None, exist_ok=True)
        commit = api.upload_folder(
            repo_id=repo.repo_id,
            folder_path=folder,
            commit_message=commit_message,
            ignore_patterns=list(ignore_patterns or []),
        )
    except Exception as exc:  # HTTP errors, refused connections, malformed answers: the user's to fix
        raise UserError(
            f"hub.push: uploading {folder} to {endpoint}/{repo_id} failed: {redact(f'{type(exc).__name__}: {exc}')} "
            f"(the model stays in output_dir; upload it later with `hf upload {repo_id} {folder}`)"
        ) from None
    return commit.commit_url
