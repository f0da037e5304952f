"""GGUF files (llama.cpp's format) as model locations, converted once into a Hugging Face folder.

Every key that names a model (``model.path``, ``reward.model_path``, evaluate's ``models=label=path``, the
pipelines' ``base_model``...) takes a ``.gguf`` file wherever it takes a model folder: a local path, a URL
(``s3://bucket/models/NAME.gguf``, ``hf://org/repo/NAME.gguf``...) or a hub repo and file
(``org/repo/NAME.gguf``, at ``model.revision``). :func:`trainer_lib.models.load.resolve_model_path` hands it
here and gets back an ordinary folder every loader reads: the weights as transformers dequantizes them
(fp32 safetensors), the config, the tokenizer with its chat template and the generation config.

The folder lives in the cache (``<cache>/gguf/<name>-<hash>``), keyed by the file's content fingerprint
(:func:`trainer_lib.storage.fingerprint`), so a second use converts nothing and a changed file converts
again. It is built in a temporary folder beside it and renamed into place when complete, under a lock, so
the ranks and processes of one machine convert once; a killed conversion leaves only its temporary
folder, which the next conversion of that file removes. ``posttrain convert-gguf`` does the same by hand.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import logging
import os
import shutil
import sys
import tempfile

from trainer_lib import storage
from trainer_lib.errors import UserError
from trainer_lib.storage import file_lock

log = logging.getLogger(__name__)

SUFFIX = ".gguf"
MAGIC = b"GGUF"
#: changes when the converted folder's layout does, so a cache never serves a folder of an older layout
LAYOUT = 1


def is_gguf(location) -> bool:
    """Whether a model location names a GGUF file (its last part ends in ``.gguf``)."""
    return isinstance(location, str) and location.rstrip("/").lower().endswith(SUFFIX)


def converted(location: str, key: str = "model.path", revision: str | None = None) -> str:
    """The Hugging Face folder of the GGUF file at ``location``: from the cache, or converted into it now.
    ``key`` names the setting in error messages; ``revision`` pins a hub repo's file."""
    local = local_file(location, key, revision)
    digest = hashlib.sha256(f"{LAYOUT}:{storage.fingerprint(local)}".encode()).hexdigest()[:16]
    name = f"{os.path.basename(local)[: -len(SUFFIX)]}-{digest}"
    root = os.path.join(storage.cache_root(), "gguf")
    target = os.path.join(root, name)
    if os.path.isdir(target):  # (renamed into place whole: there is no half-converted folder)
        return target
    what = f"converting {storage.redact(location)}"
    with file_lock.exclusive(os.path.join(root, f".{name}.lock"), what, "GGUF conversion"):
        if not os.path.isdir(target):  # another process may have converted it while this one waited
            for stale in glob.glob(os.path.join(root, glob.escape(f".{name}.tmp-") + "*")):
                shutil.rmtree(stale, ignore_errors=True)  # a killed conversion's (the lock says none runs)
            log.info("%s: converting %s into %s (once)", key, storage.redact(location), target)
            convert(local, target, location, key)
    return target


def local_file(location: str, key: str, revision: str | None = None) -> str:
    """A local copy of the GGUF file at ``location``: the file itself, a URL's copy in the download cache, or
    a hub repo's file (``org/repo/NAME.gguf``) in the hub cache."""
    if storage.is_remote(location):
        try:
            return storage.localize(location, kind="file")
        except FileNotFoundError:
            raise UserError(f"{key}: {storage.redact(location)} does not exist") from None
    path = os.path.expanduser(location)
    if os.path.isfile(path):
        return path
    parts = location.split("/")
    if os.path.exists(path) or location.startswith((".", "/", "~")) or len(parts) < 3:
        raise UserError(f"{key}: {location} {'is not a file' if os.path.exists(path) else 'does not exist'}")
    from huggingface_hub import hf_hub_download

    repo, filename = "/".join(parts[:2]), "/".join(parts[2:])
    try:
        return hf_hub_download(repo, filename, revision=revision or None)
    except (OSError, ValueError) as exc:  # no such repo, file or revision; offline; refused
        reason = " ".join(str(exc).split())
        raise UserError(
            storage.redact(f"{key}: {location} is not a local file, nor {filename} of the hub repo {repo}: {reason}")
        ) from None


def check_file(path: str, location: str, key: str) -> str:
    """The architecture a GGUF file names; a :class:`UserError` naming ``key`` for a file that is not GGUF or
    is cut short (every tensor must lie inside the file)."""
    import gguf

    with open(path, "rb") as fh:
        if fh.read(len(MAGIC)) != MAGIC:
            raise UserError(f"{key}: {location} is not a GGUF file (it does not start with the bytes GGUF)")
    try:
        reader = gguf.GGUFReader(path)
        end = max((tensor.data_offset + tensor.n_bytes for tensor in reader.tensors), default=0)
        field = reader.get_field("general.architecture")
        architecture = field.contents() if field is not None else None
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        raise UserError(f"{key}: {location} is a truncated or damaged GGUF file ({reason})") from None
    if end > os.path.getsize(path):
        raise UserError(f"{key}: {location} is a truncated GGUF file: its tensors end at byte {end}")
    if not architecture:
        raise UserError(f"{key}: {location} names no architecture (general.architecture), so it cannot be loaded")
    return architecture


def convert(gguf_file: str, out_dir: str, location: str | None = None, key: str = "gguf") -> str:
    """Write the local GGUF file ``gguf_file`` as a Hugging Face folder at ``out_dir``, which must not exist:
    built in a temporary folder beside it and renamed into place when complete; on any failure nothing is
    left. ``location`` (the file as the user gave it) and ``key`` name it in errors."""
    location = location or gguf_file
    architecture = check_file(gguf_file, location, key)
    out_dir = os.path.abspath(os.path.expanduser(out_dir))
    if os.path.exists(out_dir):
        raise UserError(f"{key}: the output {out_dir} exists already; remove it or choose another")
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(out_dir), prefix=f".{os.path.basename(out_dir)}.tmp-")
    try:
        write_folder(gguf_file, tmp, architecture, f"{key}: {location}")
        for name in os.listdir(tmp):  # readable by others, as a download is (mkdtemp and safetensors write 0o600)
            os.chmod(os.path.join(tmp, name), 0o644)
        os.chmod(tmp, 0o755)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def write_folder(gguf_file: str, out_dir: str, architecture: str, named: str) -> None:
    """Load ``gguf_file`` with transformers (dequantized to fp32) and save it into ``out_dir``.

    transformers marks a model it read from GGUF as quantized and will not save it, though its weights are
    plain tensors by then; so the same architecture is built again from the config without the GGUF flag,
    on the meta device (no second copy of the weights), takes over those tensors and saves them."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = os.path.split(os.path.abspath(gguf_file))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, IndexError, TypeError, NotImplementedError, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise UserError(
            f"{named} is a GGUF file of architecture {architecture!r}, which transformers cannot load as a "
            f"causal LM: {reason}"
        ) from None
    config = loaded.config
    del config.quantization_config  # the weights are dequantized: nothing is quantized any more
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict(), assign=True)
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def main(argv: list[str]) -> int:
    """``posttrain convert-gguf GGUF [OUT_DIR]``."""
    parser = argparse.ArgumentParser(
        prog="posttrain convert-gguf",
        description="Convert a GGUF file into a Hugging Face model folder (fp32 safetensors, config, tokenizer "
        "with its chat template, generation config). Every model key (model.path=NAME.gguf ...) does the "
        "same by itself, into the cache.",
    )
    parser.add_argument("gguf", help="the GGUF file: a local path, a URL (s3://...), or org/repo/NAME.gguf on the hub")
    parser.add_argument("out_dir", nargs="?", help="a new local folder; default: the cache model.path=GGUF uses")
    parser.add_argument("--revision", default="", help="the hub revision of org/repo/NAME.gguf (default main)")
    args = parser.parse_args(argv)
    if not is_gguf(args.gguf):
        raise UserError(f"gguf: {args.gguf} does not end in {SUFFIX}")
    if args.out_dir is None:
        print(converted(args.gguf, "gguf", args.revision))
        return 0
    print(convert(local_file(args.gguf, "gguf", args.revision), args.out_dir, args.gguf))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
