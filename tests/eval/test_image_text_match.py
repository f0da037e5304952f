"""The image-text match metric: retrieval among K distractors and the mean CLIP score, on fixed cosine
tables worked out by hand."""

import pytest
import torch

from trainer_lib.eval.image_text_match import (
    choose_distractors,
    cosine_table,
    image_text_match,
    match_metrics,
    retrieval_hits,
)

# text i (rows) against image j (columns)
TABLE = [
    [0.9, 0.1, 0.2, 0.0],  # own 0.9 beats 0.1, 0.2: hit
    [0.5, 0.4, 0.3, 0.1],  # own 0.4 loses to 0.5: miss
    [0.2, 0.2, 0.2, 0.1],  # own 0.2 ties 0.2: a tie is a miss
    [-0.3, -0.5, -0.6, -0.2],  # own -0.2 beats -0.3, -0.5: hit
]
LINEUPS = [[1, 2], [0, 3], [0, 3], [0, 1]]


def test_retrieval_hits_and_metrics_equal_a_hand_computation():
    assert retrieval_hits(TABLE, LINEUPS) == [True, False, False, True]
    metrics = match_metrics(TABLE, LINEUPS)
    assert metrics["image_text_match_accuracy"] == 0.5
    own = [0.9, 0.4, 0.2, -0.2]
    assert metrics["clip_score_mean"] == pytest.approx(sum((c + 1) / 2 for c in own) / 4)  # 0.6625
    assert metrics["clip_score_mean"] == pytest.approx(0.6625)
    assert (metrics["pairs"], metrics["distractors"]) == (4, 2)
    # only the line-up counts: against image 3 alone, text 1 (0.4 > 0.1) and text 2 (0.2 > 0.1) hit
    assert retrieval_hits(TABLE, [[1], [3], [3], [0]]) == [True, True, True, True]


def test_distractors_differ_in_label_are_seeded_and_refuse_too_few():
    labels = ["a red circle", "a red circle", "a blue square", "a green triangle", "a blue square", "a red square"]
    lineups = choose_distractors(labels, k=3, seed=7)
    assert lineups == choose_distractors(labels, k=3, seed=7)
    assert lineups != choose_distractors(labels, k=3, seed=8)
    for i, lineup in enumerate(lineups):
        assert len(set(lineup)) == 3 and i not in lineup
        assert all(labels[j] != labels[i] for j in lineup)  # never a twin of the right image
    with pytest.raises(ValueError, match="pair 0: only 4 images differ from its label .a red circle., need 5"):
        choose_distractors(labels, k=5)
    with pytest.raises(ValueError, match="at least one distractor"):
        choose_distractors(labels, k=0)


class FixedScorer:
    """A scorer with fixed unit embeddings (the two methods ClipScorer offers the metric)."""

    def __init__(self, texts: dict, images: dict):
        self.texts, self.images = texts, images

    def text_embeddings(self, texts):
        return torch.nn.functional.normalize(torch.tensor([self.texts[t] for t in texts]), dim=-1)

    def image_embeddings(self, refs):
        return torch.nn.functional.normalize(torch.tensor([self.images[r["path"]] for r in refs]), dim=-1)


def test_image_text_match_on_a_scorer_with_fixed_embeddings():
    scorer = FixedScorer(
        {"red": [1.0, 0.0], "blue": [0.0, 1.0], "purple": [1.0, 1.0]},
        {"r.png": [1.0, 0.0], "b.png": [0.0, 1.0], "g.png": [-1.0, 0.0]},
    )
    images = [{"path": p} for p in ("r.png", "b.png", "g.png")]
    table = cosine_table(scorer, ["red", "purple", "red"], images)
    half = 2**-0.5
    assert table.flatten().tolist() == pytest.approx([1, 0, -1, half, half, -half, 1, 0, -1])
    labels = ["r", "b", "g"]  # K=2: each line-up is the other two images
    got = image_text_match(scorer, ["red", "purple", "red"], images, labels, k=2, seed=0)
    # red on r.png: 1 > 0, -1 hit; purple on b.png: 0.71 ties r.png's 0.71, a miss; red on g.png: -1 < 1 miss
    assert got["image_text_match_accuracy"] == pytest.approx(1 / 3)
    assert got["clip_score_mean"] == pytest.approx(((1 + 1) / 2 + (half + 1) / 2 + 0) / 3)
    with pytest.raises(ValueError, match="one text per image"):
        cosine_table(scorer, ["red"], images)
