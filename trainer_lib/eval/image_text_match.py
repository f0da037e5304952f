"""Image-text match: does a held-out CLIP pick a completion's own image out of a line-up?

For held-out pairs ``(image_i, prompt_i)`` with completion ``c_i`` (generated from ``prompt_i``), a scorer
that the policy was NOT trained against (a second CLIP: judging by the reward the policy optimised would
reward its exploits) embeds texts and images, and::

    s_ij        = cosine(text embedding of c_i, image embedding of image_j)
    hit_i       = s_ii > max_{j in D_i} s_ij          D_i: K distractor images for pair i
    accuracy    = mean_i hit_i                        (retrieval accuracy among K + 1 images)
    clip_score  = mean_i (s_ii + 1) / 2               (the CLIP reward's scale, trainer_lib.rewards.clip)

``D_i`` is ``K`` other held-out images whose label (e.g. their true description) differs from image
``i``'s, drawn from a seed, so a line-up never holds a twin of the right image and the same seed gives
the same line-ups for every model compared. A tie counts as a miss. Chance level is ``1 / (K + 1)``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

#: distractor images per pair: chance is 1 / (K + 1) = 0.2.
DISTRACTORS = 4


def choose_distractors(labels: Sequence[str], k: int = DISTRACTORS, seed: int = 0) -> list[list[int]]:
    """For each pair ``i``, ``k`` indices ``j != i`` with ``labels[j] != labels[i]``, drawn from ``seed``."""
    if k < 1:
        raise ValueError(f"k: expected at least one distractor, got {k}")
    lineups = []
    for i, label in enumerate(labels):
        others = [j for j, other in enumerate(labels) if other != label]
        if len(others) < k:
            raise ValueError(f"pair {i}: only {len(others)} images differ from its label {label!r}, need {k}")
        lineups.append(random.Random(f"{seed}:{i}").sample(others, k))
    return lineups


def retrieval_hits(similarity, distractors: Sequence[Sequence[int]]) -> list[bool]:
    """``hit_i = similarity[i][i] > max_j similarity[i][j]`` over ``j`` in ``distractors[i]`` (module doc);
    ``similarity`` is any ``N x N`` table indexable as ``[i][j]`` (text i, image j)."""
    return [
        float(similarity[i][i]) > max(float(similarity[i][j]) for j in lineup) for i, lineup in enumerate(distractors)
    ]


def match_metrics(similarity, distractors: Sequence[Sequence[int]]) -> dict:
    """``image_text_match_accuracy`` and ``clip_score_mean`` (module doc) of an ``N x N`` cosine table."""
    hits = retrieval_hits(similarity, distractors)
    own = [(float(similarity[i][i]) + 1) / 2 for i in range(len(hits))]
    return {
        "image_text_match_accuracy": sum(hits) / len(hits),
        "clip_score_mean": sum(own) / len(own),
        "pairs": len(hits),
        "distractors": len(distractors[0]) if distractors else 0,
    }


def cosine_table(scorer, texts: list[str], images: list[dict]):
    """``N x N`` cosines of ``scorer``'s (a :class:`trainer_lib.rewards.clip.ClipScorer`) unit text and image
    embeddings: row ``i`` is ``texts[i]``, column ``j`` is ``images[j]`` (normalized image references)."""
    if len(texts) != len(images):
        raise ValueError(f"expected one text per image, got {len(texts)} texts and {len(images)} images")
    return scorer.text_embeddings(texts) @ scorer.image_embeddings(images).T


def image_text_match(scorer, texts: list[str], images: list[dict], labels: Sequence[str], k: int, seed: int) -> dict:
    """The metrics of module doc for completions ``texts`` of the pairs whose images are ``images``."""
    return match_metrics(cosine_table(scorer, texts, images).tolist(), choose_distractors(labels, k, seed))


def load_pairs(path: str, limit: int = 0) -> list[dict]:
    """Held-out rows ``{"prompt", "images", "label"}`` from any dataset source (``image_match.path``):
    a prompt (text or messages) and its ``images`` column, checked and hashed as training data is
    (:mod:`trainer_lib.data.images`); ``label`` is the row's own ``label`` column (e.g. the true
    description: two rows with one label are never each other's distractors), else its first image's hash."""
    from trainer_lib.data.images import IMAGES, normalize_images
    from trainer_lib.data.sources import iter_source
    from trainer_lib.errors import DataError, UserError

    rows = []
    for location, row in iter_source(path, key="image_match.path"):
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) and prompt.strip()) and not isinstance(prompt, list):
            raise DataError(location, "prompt", "a non-empty string or a list of messages", prompt)
        if not row.get(IMAGES):
            raise DataError(location, IMAGES, "a list of one or more images the prompt is about", row.get(IMAGES))
        images = normalize_images(row, ("prompt",), location)
        rows.append({"prompt": prompt, "images": images, "label": str(row.get("label") or images[0]["sha256"])})
        if limit and len(rows) >= limit:
            break
    if not rows:
        raise UserError(f"image_match.path: {path}: no rows")
    return rows


def score_pairs(scorer, rows: list[dict], completions: list[str], k: int, seed: int) -> tuple[dict, list[dict]]:
    """(metrics, per-pair rows) of one model's completions to ``rows``: each completion against its row's
    first image in a line-up of ``k`` distractors (module doc)."""
    from trainer_lib.data.formats import generated_text

    texts = [generated_text(c) for c in completions]
    table = cosine_table(scorer, texts, [row["images"][0] for row in rows]).tolist()
    lineups = choose_distractors([row["label"] for row in rows], k, seed)
    hits = retrieval_hits(table, lineups)
    per_pair = [
        {"label": row["label"], "completion": text, "clip_score": (table[i][i] + 1) / 2, "matched": hit}
        for i, (row, text, hit) in enumerate(zip(rows, texts, hits))
    ]
    return match_metrics(table, lineups), per_pair
