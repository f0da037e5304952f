"""NLPO's action mask: the nucleus by hand, every sampled token inside the masking policy's nucleus,
log-probs renormalized over it, and the masking policy's refresh and checkpoint state."""

import copy
import math

import pytest
import torch

from trainer_lib.errors import ConfigError
from trainer_lib.rl.nlpo import MaskedActions, MaskingPolicy, top_p_set
from trainer_lib.rl.rollout import generate, token_logprobs

pytestmark = pytest.mark.usefixtures("single_thread")


def test_top_p_set_by_hand():
    # probabilities 0.05, 0.5, 0.15, 0.3: sorted 0.5 (id 1), 0.3 (id 3), 0.15 (id 2), 0.05 (id 0);
    # the mass before each of them: 0, 0.5, 0.8, 0.95
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    assert top_p_set(logits, 0.01).tolist() == [[False, True, False, False]]  # the top token always
    assert top_p_set(logits, 0.5).tolist() == [[False, True, False, False]]  # 0.5 reaches 0.5
    assert top_p_set(logits, 0.7).tolist() == [[False, True, False, True]]
    assert top_p_set(logits, 0.81).tolist() == [[False, True, True, True]]
    assert top_p_set(logits, 1.0).all()


@pytest.fixture(scope="module")
def models(tiny_model_dir):
    """The tiny policy, a masking policy that differs from it (perturbed weights), a tokenizer, prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.conftest import CHAT_ROWS
    from trainer_lib.data.preference_batches import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    masker = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in masker.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
            param.requires_grad_(False)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q, _ in CHAT_ROWS[:6]]
    return policy, masker, tokenizer, prompts


def _nucleus_of(masker, rollout, top_p):
    """The masking policy's nucleus at every response position, by a full forward written out here."""
    width = rollout.response_ids.shape[1]
    with torch.no_grad():
        logits = masker(**rollout.model_inputs("cpu"), use_cache=False).logits[:, -(width + 1) : -1]
    probs = torch.softmax(logits.float(), -1)
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)
    keep = (ranked.cumsum(-1) - ranked) < top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


def test_every_sampled_token_is_inside_the_masking_policys_nucleus(models):
    policy, masker, tokenizer, prompts = models
    top_p = 0.3
    masking = MaskingPolicy(policy, masker, top_p=top_p, update_steps=1000, temperature=1.0)
    settings = {"n": 4, "max_new_tokens": 16, "temperature": 1.0, "batch_size": 10, "seed": 3}
    masked = generate(policy, tokenizer, prompts, **settings, logits_processor=masking.processor)
    nucleus = _nucleus_of(masker, masked, top_p)
    taken = nucleus.gather(-1, masked.response_ids.unsqueeze(-1)).squeeze(-1)
    response = masked.response_mask.bool()
    assert int(response.sum()) > 100
    assert taken[response].all(), f"{int((~taken[response]).sum())} sampled tokens outside the mask"
    assert nucleus.sum(-1)[response].float().mean() < 0.5 * nucleus.shape[-1]  # the mask does cut the vocabulary

    # the same draw without the mask leaves the nucleus: the check above has teeth
    free = generate(policy, tokenizer, prompts, **settings)
    free_taken = _nucleus_of(masker, free, top_p).gather(-1, free.response_ids.unsqueeze(-1)).squeeze(-1)
    assert not free_taken[free.response_mask.bool()].all()

    # the stage samples through the mask checked above
    actions = MaskedActions(masking)
    assert actions.logits_processor == masking.processor

    # log-probs in the masked policy: renormalized over the nucleus (plus the token taken)
    with torch.no_grad():
        logprobs, entropy, metrics = actions.logprobs(policy, masked, 1.0)
    assert float(metrics["nlpo/off_mask_fraction"]) == 0.0
    with torch.no_grad():
        full, _ = token_logprobs(policy, masked, 1.0)
        width = masked.response_ids.shape[1]
        logits = policy(**masked.model_inputs("cpu"), use_cache=False).logits[:, -(width + 1) : -1]
    row, col = 0, 2  # one position by hand: log p(y) - log sum_{v in nucleus} p(v)
    expected = full[row, col] - torch.logsumexp(torch.log_softmax(logits[row, col], -1)[nucleus[row, col]], -1)
    assert math.isclose(float(logprobs[row, col]), float(expected), abs_tol=1e-5)
    assert (logprobs[response] >= full[response] - 1e-6).all()  # a subset's renormalized probability is higher
    assert torch.isfinite(entropy).all()


def test_masking_policy_refreshes_every_n_steps_and_restores_its_weights(models):
    policy, _, _, _ = models
    actor = copy.deepcopy(policy).train()
    masking = MaskingPolicy(actor, copy.deepcopy(policy), top_p=0.9, update_steps=3, temperature=1.0)
    name = "model.embed_tokens.weight"

    def weight(model):
        return dict(model.named_parameters())[name].detach().clone()

    def nudge():
        with torch.no_grad():
            dict(actor.named_parameters())[name].add_(0.01)

    masking.begin_step(0)
    copied = weight(actor)
    nudge()
    masking.begin_step(1)
    nudge()
    masking.begin_step(2)  # steps 1 and 2 keep the copy made at step 0
    assert torch.equal(weight(masking.model), copied) and not torch.equal(weight(actor), copied)
    state = masking.state_dict()  # saved after step 2: step 3 copies anew, so no weights are kept
    assert state["copied_at"] == 0 and state["weights"] == {}
    masking.begin_step(3)
    assert torch.equal(weight(masking.model), weight(actor))
    nudge()
    masking.begin_step(4)
    state = masking.state_dict()  # saved after step 4: the step-3 copy is kept
    assert state["copied_at"] == 3 and torch.equal(state["weights"][name], weight(masking.model))

    resumed = MaskingPolicy(actor, copy.deepcopy(policy), top_p=0.9, update_steps=3, temperature=1.0)
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), masking.model.parameters()))
    other = MaskingPolicy(actor, copy.deepcopy(policy), top_p=0.9, update_steps=5, temperature=1.0)
    with pytest.raises(ConfigError, match="mask_update_steps"):
        other.load_state_dict(state)
