"""A CLIP-space reward: how well a completion describes its prompt's image(s).

``reward.clip_path`` names a dual encoder that transformers loads with ``AutoModel`` and whose
tokenizer and image processor load with ``AutoTokenizer`` / ``AutoImageProcessor`` (CLIP and models
shaped like it: ``get_text_features`` and ``get_image_features`` giving projected embeddings in one
space). For a completion ``c`` and the images ``x_1..x_k`` of its prompt's row (the ``images``
column, :mod:`trainer_lib.data.images`)::

    cos_j  = <t, v_j> / (|t| |v_j|)          t = text embedding of c, v_j = image embedding of x_j
    reward = (mean_j cos_j + 1) / 2          in [0, 1]

The cosine is used without CLIP's logit scale (a temperature of ~100 learnt for the contrastive loss:
it would make this source dwarf rewards in [0, 1]), and mapped affinely onto [0, 1] like the other
bounded sources (a classifier's probability, the accuracy rewards), so ``reward.weights`` compare;
being affine it keeps every difference between completions (a weight of 2 gives the raw cosine's
spread). Image embeddings are computed once per image content (sha256) and kept, since the ``rollout.n``
completions of a prompt share its images; texts and new images go through the model in batches.
"""

from __future__ import annotations

from collections import OrderedDict

from trainer_lib.data.formats import generated_text
from trainer_lib.errors import UserError
from trainer_lib.models.dual_encoder import embeddings_of

#: image embeddings kept in memory, by content hash (a few MB at CLIP's 512-1024 dimensions).
CACHED_IMAGES = 4096


class ClipScorer:
    """``scorer(prompts, completions, images=..., **columns) -> list[float]``: the CLIP-space match of
    each completion with its row's images, in [0, 1] (module doc)."""

    def __init__(
        self,
        path: str,
        batch_size: int = 16,
        device="cpu",
        trust_remote_code: bool = False,
        key: str = "reward.clip_path",
    ):
        from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

        from trainer_lib.models.load import resolve_model_path

        local = resolve_model_path(path, key)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(local, trust_remote_code=trust_remote_code)
            self.image_processor = AutoImageProcessor.from_pretrained(local, trust_remote_code=trust_remote_code)
            self.model = AutoModel.from_pretrained(local, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise UserError(
                f"{key}: could not load a CLIP-like model (AutoModel, tokenizer, image processor) from {path}: {exc}"
            ) from None
        if not (hasattr(self.model, "get_text_features") and hasattr(self.model, "get_image_features")):
            raise UserError(
                f"{key}: {path} is a {type(self.model).__name__}, not a dual encoder "
                "(it needs get_text_features and get_image_features, as CLIPModel has)"
            )
        self.model.requires_grad_(False)
        self.model.to(device).eval()
        text_config = getattr(self.model.config, "text_config", None)
        positions = getattr(text_config, "max_position_embeddings", None) or self.tokenizer.model_max_length
        self.max_length = min(int(positions), int(self.tokenizer.model_max_length))
        self.path, self.key, self.batch_size, self.device = path, key, batch_size, device
        self.image_cache: OrderedDict = OrderedDict()

    def describe(self) -> str:
        return f"(cos + 1) / 2 of completion and image embeddings of {self.path}"

    def text_embeddings(self, texts: list[str]):
        """Unit-length text embeddings ``(N, D)``, float32 on the CPU."""
        import torch

        out = []
        for start in range(0, len(texts), self.batch_size):
            batch = self.tokenizer(
                texts[start : start + self.batch_size],
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
            inputs = {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}
            with torch.no_grad():
                out.append(embeddings_of(self.model.get_text_features(**inputs)).float().cpu())
        return torch.nn.functional.normalize(torch.cat(out), dim=-1)

    def image_embeddings(self, refs: list[dict]):
        """Unit-length image embeddings ``(M, D)`` of normalized image references; the ones seen
        before come from the cache (by sha256)."""
        import torch

        from trainer_lib.data.images import content_hash, image_bytes, load_image

        keys = [ref.get("sha256") or content_hash(image_bytes(ref)) for ref in refs]
        missing = list(OrderedDict((k, ref) for k, ref in zip(keys, refs) if k not in self.image_cache).items())
        for start in range(0, len(missing), self.batch_size):
            chunk = missing[start : start + self.batch_size]
            pixels = self.image_processor(images=[load_image(ref) for _, ref in chunk], return_tensors="pt")
            with torch.no_grad():
                values = pixels["pixel_values"].to(self.device, self.model.dtype)
                embeds = embeddings_of(self.model.get_image_features(pixel_values=values)).float().cpu()
            for (key, _), embed in zip(chunk, torch.nn.functional.normalize(embeds, dim=-1)):
                self.image_cache[key] = embed
        rows = []
        for key in keys:
            self.image_cache.move_to_end(key)
            rows.append(self.image_cache[key])
        while len(self.image_cache) > CACHED_IMAGES:
            self.image_cache.popitem(last=False)
        return torch.stack(rows)

    def __call__(self, prompts: list, completions: list, images: list | None = None, **columns) -> list[float]:
        import torch

        rows = images if images is not None else [None] * len(completions)
        for i, refs in enumerate(rows):
            if not refs:
                from trainer_lib.rewards.classifier import prompt_text

                raise UserError(
                    f"{self.key}: the prompt {prompt_text(prompts[i])[:60]!r} has no images; the CLIP reward "
                    "scores a completion against its prompt's images, so every prompt row needs an 'images' "
                    "column (docs/multimodal.md)"
                )
        texts = self.text_embeddings([generated_text(c) for c in completions])
        flat = [ref for refs in rows for ref in refs]
        pictures = self.image_embeddings(flat)
        owner = torch.tensor([i for i, refs in enumerate(rows) for _ in refs])
        cosines = (texts[owner] * pictures).sum(dim=-1)  # one per (completion, image) pair
        counts = torch.bincount(owner, minlength=len(rows)).double()
        mean = torch.zeros(len(rows), dtype=torch.float64).index_add_(0, owner, cosines.double()) / counts
        return ((mean + 1) / 2).tolist()
