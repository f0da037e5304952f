"""Rollouts: left padding is invisible, n samples per prompt, seeded sampling, stop strings, log-probs."""

import pytest
import torch

from trainer_lib.rl.rollout import generate, token_logprobs

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [tokenizer(t)["input_ids"] for t in ("Say hello.", "What is two plus two? Name a color.", "Blue")]
    assert len({len(p) for p in prompts}) == 3  # different lengths, so the batch is left-padded
    return model, tokenizer, prompts


def test_batched_greedy_generation_equals_one_prompt_at_a_time(policy):
    model, tokenizer, prompts = policy
    batched = generate(model, tokenizer, prompts, n=2, max_new_tokens=8, temperature=0.0)
    assert batched.prompt_ids.shape[0] == 6 and batched.response_ids.shape[0] == 6
    for i, prompt in enumerate(prompts):
        single = generate(model, tokenizer, [prompt], n=1, max_new_tokens=8, temperature=0.0)
        length = int(single.response_mask.sum())
        for row in (2 * i, 2 * i + 1):  # n consecutive rows per prompt
            assert batched.prompt_ids[row][batched.prompt_mask[row].bool()].tolist() == prompt
            assert batched.response_ids[row, :length].tolist() == single.response_ids[0, :length].tolist()
            assert int(batched.response_mask[row].sum()) == length
            assert batched.completions[row] == single.completions[0]
    assert batched.stats["generated_tokens"] == int(batched.response_mask.sum())
    assert batched.stats["tokens_per_s"] > 0


def test_sampling_is_seeded_and_leaves_the_global_rng_alone(policy):
    model, tokenizer, prompts = policy
    torch.manual_seed(7)
    before = torch.get_rng_state()
    a = generate(
        model, tokenizer, prompts, n=4, max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.95, batch_size=5, seed=1
    )
    assert torch.equal(torch.get_rng_state(), before)
    b = generate(
        model, tokenizer, prompts, n=4, max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.95, batch_size=5, seed=1
    )
    c = generate(model, tokenizer, prompts, n=4, max_new_tokens=8, temperature=1.0, top_k=50, top_p=0.95, seed=2)
    assert len(a) == 12 and a.completions == b.completions
    assert a.completions != c.completions
    assert len(set(a.completions[:4])) > 1  # the n samples of one prompt differ


def test_stop_strings_cut_the_text_and_end_the_response(policy):
    model, tokenizer, prompts = policy
    free = generate(model, tokenizer, prompts[:1], max_new_tokens=12, temperature=0.0)
    text = free.completions[0]
    assert len(text) > 4, text
    stop = text[2:4]
    cut = generate(model, tokenizer, prompts[:1], max_new_tokens=12, temperature=0.0, stop=[stop])
    assert cut.completions[0] == text[: text.find(stop)]
    assert cut.finished == [True]
    ids = cut.response_ids[0, : int(cut.response_mask.sum())].tolist()
    assert stop in tokenizer.decode(ids) and stop not in tokenizer.decode(ids[:-1])  # ends on the stop token


def test_a_response_ends_at_its_first_eos_or_stop_token(policy):
    from trainer_lib.rl.rollout import _cut

    _, tokenizer, _ = policy
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    hello = tokenizer("Hello there", add_special_tokens=False)["input_ids"]
    assert _cut(tokenizer, hello + [eos, pad, pad], []) == (hello + [eos], "Hello there", True)
    assert _cut(tokenizer, hello, []) == (hello, "Hello there", False)  # ran out of tokens
    ids, text, finished = _cut(tokenizer, hello + [eos], [" the"])
    assert text == "Hello" and finished and " the" in tokenizer.decode(ids)
    assert " the" not in tokenizer.decode(ids[:-1])


def test_token_logprobs_are_padding_invariant_and_match_the_greedy_choice(policy):
    model, tokenizer, prompts = policy
    rollout = generate(model, tokenizer, prompts, n=1, max_new_tokens=6, temperature=0.0)
    with torch.no_grad():
        batched, entropy = token_logprobs(model, rollout, with_entropy=True)
        for row in range(len(rollout)):
            part = rollout.select([row])  # trims the padding columns away
            assert part.prompt_mask.all()
            single, _ = token_logprobs(model, part)
            assert torch.allclose(single[0], batched[row, : single.shape[1]], atol=1e-5)
        # greedy tokens are the argmax: their log-prob is the max over the vocabulary
        inputs = rollout.model_inputs("cpu")
        logits = model(**inputs).logits[:, -rollout.response_ids.shape[1] - 1 : -1]
        best = torch.log_softmax(logits.float(), -1).max(-1).values * rollout.response_mask
    assert torch.allclose(batched, best, atol=1e-5)
    assert ((entropy > 0) == rollout.response_mask.bool()).all()
    assert (batched[rollout.response_mask == 0] == 0).all()


def test_a_shared_prompt_cache_gives_each_sample_the_logits_of_its_own_prefill(policy):
    from trainer_lib.rl.rollout import shared_prompt_cache

    model, tokenizer, prompts = policy
    width = max(len(p) for p in prompts)  # left-padded, as generate pads them
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        alone = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        cache = shared_prompt_cache(model, ids, mask, n=3)
        assert cache.get_seq_length() == ids.shape[1] - 1
        last = model(
            input_ids=ids[:, -1:].repeat_interleave(3, 0),
            attention_mask=mask.repeat_interleave(3, 0),
            position_ids=positions[:, -1:].repeat_interleave(3, 0),
            cache=cache,
        ).logits[:, -1]
    torch.testing.assert_close(last, alone.repeat_interleave(3, 0), rtol=1e-5, atol=1e-5)
    assert not torch.equal(last[0], last[3])  # rows 0-2 and 3-5 are different prompts


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_samplers_recorded_logprobs_are_the_training_models(policy, temperature):
    """The rollout engine (transformers' generate with a KV cache, fp32) and the trained model's forward over
    the whole sequence give each sampled token the same log-prob: within 1e-4 (float32 rounding of a cached
    decode against one full forward, over a 49-token vocabulary here and 49,152 on SmolLM2)."""
    model, tokenizer, prompts = policy
    rollout = generate(
        model, tokenizer, prompts, n=3, max_new_tokens=10, temperature=temperature, seed=3, record_logprobs=True
    )
    assert rollout.logprobs is not None and rollout.logprobs.shape == rollout.response_ids.shape
    with torch.no_grad():
        trained, _ = token_logprobs(model, rollout, temperature)
    mask = rollout.response_mask.bool()
    assert mask.sum() > 10 and (rollout.logprobs[~mask] == 0).all()
    torch.testing.assert_close(rollout.logprobs[mask], trained[mask], rtol=0, atol=1e-4)
    assert (rollout.logprobs[mask] < 0).all()
    part = rollout.select([1, 4])  # selecting rows keeps their log-probs
    torch.testing.assert_close(part.logprobs, rollout.logprobs[[1, 4], : part.response_ids.shape[1]])
    plain = generate(model, tokenizer, prompts, n=3, max_new_tokens=10, temperature=temperature, seed=3)
    assert plain.logprobs is None and plain.completions == rollout.completions  # recording changes no sample


def test_recorded_logprobs_of_a_bf16_rollout_differ_from_fp32_training(policy):
    """A bf16 copy sampling for an fp32 trained model: the gap the truncated importance weights correct."""
    model, tokenizer, prompts = policy
    copy = type(model)(model.config).to(torch.bfloat16).eval()
    copy.load_state_dict(model.state_dict())
    rollout = generate(copy, tokenizer, prompts, n=2, max_new_tokens=8, temperature=1.0, seed=0, record_logprobs=True)
    with torch.no_grad():
        trained, _ = token_logprobs(model, rollout)
    mask = rollout.response_mask.bool()
    gap = (rollout.logprobs[mask] - trained[mask]).abs()
    assert 0 < gap.max() < 0.1
