"""Our own decode loop: greedy equals ``model.generate``'s, compaction changes nothing, the sampler draws from
softmax and records the training forward's log-probs, seeds, eos and stop strings."""

import math

import pytest
import torch

from trainer_lib.rl.decode import StopStrings, decode, sample_tokens
from trainer_lib.rl.rollout import generate, pad_rows, token_logprobs

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    texts = ("Say hello.", "What is two plus two? Name a color.", "Blue", "Is the sky green?")
    ids, mask = pad_rows([tokenizer(t)["input_ids"] for t in texts], tokenizer.pad_token_id, left=True)
    assert len(set(mask.sum(1).tolist())) == 4  # different lengths, so the batch is left-padded
    return model, tokenizer, ids, mask


def run(policy, **kwargs):
    model, tokenizer, ids, mask = policy
    settings = {"max_new_tokens": 12, "eos_ids": [tokenizer.eos_token_id], "pad_id": tokenizer.pad_token_id}
    return decode(model, ids, mask, **{**settings, **kwargs})


def test_greedy_decoding_is_token_identical_to_model_generate(policy):
    model, tokenizer, ids, mask = policy
    ours = run(policy, temperature=0.0, max_new_tokens=16)
    with torch.no_grad():
        theirs = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=16,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )[:, ids.shape[1] :].tolist()
    for row, tokens in enumerate(ours.tokens):
        assert tokens and tokens == theirs[row][: len(tokens)]
        assert len(tokens) == 16 or tokens[-1] == tokenizer.eos_token_id


def test_a_sliding_window_model_decodes_as_generate_does(policy):
    """Mistral with a window of 8 tokens, shorter than every row: transformers' own mask, not ours."""
    from transformers import MistralConfig, MistralForCausalLM

    _, tokenizer, ids, mask = policy
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    config = MistralConfig(vocab_size=300, num_key_value_heads=2, sliding_window=8, **shape)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = MistralForCausalLM(config).eval()
    settings = {"max_new_tokens": 12, "eos_ids": [], "pad_id": tokenizer.pad_token_id, "temperature": 0.0}
    ours = decode(model, ids, mask, **settings).tokens
    with torch.no_grad():
        theirs = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, pad_token_id=0, eos_token_id=None
        )[:, ids.shape[1] :].tolist()
    assert ours == theirs


def ragged_eos(policy, temperature: float) -> list[int]:
    """End tokens that make the rows end at different steps: tokens rows 0-2 draw at steps 2, 5 and 8 (seed 5;
    the random tiny model repeats one token per row greedily, so there rows end after 1 or 12 tokens)."""
    free = run(policy, temperature=temperature, eos_ids=[], generator=torch.Generator().manual_seed(5))
    picks = {free.tokens[0][1], free.tokens[1][4], free.tokens[2][7]}
    lengths = [next((i + 1 for i, t in enumerate(row) if t in picks), 12) for row in free.tokens]
    assert len(set(lengths)) >= (3 if temperature > 0 else 2), lengths
    return sorted(picks)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dropping_finished_rows_changes_no_token(policy, temperature):
    """Each step draws a number for every row of the chunk, so compaction changes no sample either."""
    eos = ragged_eos(policy, temperature)
    outs = [
        run(policy, temperature=temperature, eos_ids=eos, compact_every=k, generator=torch.Generator().manual_seed(5))
        for k in (0, 1, 3)
    ]
    assert len({len(row) for row in outs[0].tokens}) >= 2  # rows of different lengths
    for out in outs[1:]:
        assert out.tokens == outs[0].tokens
        for ours, uncompacted in zip(out.logprobs, outs[0].logprobs):
            assert ours == pytest.approx(uncompacted, abs=1e-5)


@pytest.mark.parametrize("temperature,top_k", [(1.0, 0), (0.7, 5), (0.0, 0)])
def test_recorded_logprobs_are_the_training_forwards(policy, temperature, top_k):
    """fp32: the log-prob recorded at sampling time and the training forward's agree within 1e-5 (rounding of a
    cached one-token decode against one full forward); top-k truncation is not counted in either."""
    model, tokenizer, ids, _ = policy
    prompts = [row[row != tokenizer.pad_token_id].tolist() for row in ids]
    rollout = generate(
        model, tokenizer, prompts, n=3, max_new_tokens=10, temperature=temperature, top_k=top_k, record_logprobs=True
    )
    with torch.no_grad():
        trained, _ = token_logprobs(model, rollout, temperature)
    scored = rollout.response_mask.bool()
    assert scored.sum() > 20
    torch.testing.assert_close(rollout.logprobs[scored], trained[scored], rtol=0, atol=1e-5)
    assert (rollout.logprobs[~scored] == 0).all()


def test_the_same_seed_gives_the_same_samples_and_the_global_rng_is_untouched(policy):
    torch.manual_seed(11)
    before = torch.get_rng_state()
    a = run(policy, generator=torch.Generator().manual_seed(1), top_p=0.9)
    assert torch.equal(torch.get_rng_state(), before)
    b = run(policy, generator=torch.Generator().manual_seed(1), top_p=0.9)
    c = run(policy, generator=torch.Generator().manual_seed(2), top_p=0.9)
    assert a.tokens == b.tokens and a.logprobs == b.logprobs
    assert a.tokens != c.tokens


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def draws(temperature: float, top_k: int = 0, top_p: float = 1.0, count: int = 20_000):
    uniform = torch.rand(count, generator=torch.Generator().manual_seed(0))
    return sample_tokens(LOGITS.expand(count, -1), uniform, temperature, top_k, top_p)


def assert_frequencies(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    """Each token's frequency within 4 standard errors of its probability."""
    count = len(tokens)
    frequencies = torch.bincount(tokens, minlength=len(probs)).double() / count
    for p, f in zip(probs.double().tolist(), frequencies.tolist()):
        assert abs(f - p) <= 4 * math.sqrt(p * (1 - p) / count) + 1e-12, (p, f)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_the_sampler_draws_from_the_softmax_and_records_its_log_probs(temperature):
    tokens, logprobs = draws(temperature)
    assert_frequencies(tokens, torch.softmax(LOGITS / temperature, -1))
    expected = torch.log_softmax(LOGITS / temperature, -1)[tokens]
    torch.testing.assert_close(logprobs, expected, rtol=0, atol=1e-6)


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    probs = torch.softmax(LOGITS, -1)  # 0.57, 0.21, 0.13, 0.08, 0.03, 0.004
    tokens, logprobs = draws(1.0, top_k=2)
    assert_frequencies(tokens, torch.cat([probs[:2] / probs[:2].sum(), torch.zeros(4)]))
    torch.testing.assert_close(logprobs, probs.log()[tokens], rtol=0, atol=1e-6)  # truncation not counted
    tokens, _ = draws(1.0, top_p=0.85)  # the mass before token 2 is 0.78 < 0.85, before token 3 it is 0.91
    assert_frequencies(tokens, torch.cat([probs[:3] / probs[:3].sum(), torch.zeros(3)]))
    tokens, _ = draws(1.0, top_k=4, top_p=0.5)  # top-p of the top-4 distribution: token 0 alone holds 0.58
    assert tokens.eq(0).all()
    greedy, logprob = sample_tokens(LOGITS[None], None, 0.0)
    assert greedy.tolist() == [0] and logprob.item() == pytest.approx(probs[0].log().item())


def test_eos_and_stop_strings_end_a_row(policy):
    _, tokenizer, ids, _ = policy
    free = run(policy, temperature=0.0, eos_ids=[])
    assert all(len(row) == 12 for row in free.tokens)
    end = free.tokens[1][3]
    ended = run(policy, temperature=0.0, eos_ids=[end]).tokens[1]
    assert ended == free.tokens[1][: free.tokens[1].index(end) + 1]
    text = tokenizer.decode(free.tokens[0])
    stop = text[3:5]
    assert len(stop) == 2
    cut = run(policy, temperature=0.0, eos_ids=[], stop=StopStrings(tokenizer, [stop])).tokens[0]
    assert stop in tokenizer.decode(cut) and stop not in tokenizer.decode(cut[:-1])
    assert cut == free.tokens[0][: len(cut)]
    in_prompt = tokenizer.decode(ids[2][ids[2] != tokenizer.pad_token_id])[:2]  # only generated text counts
    assert len(run(policy, temperature=0.0, eos_ids=[], stop=StopStrings(tokenizer, [in_prompt])).tokens[2]) > 0


def test_a_logits_processor_masks_every_step_of_every_row(policy):
    """NLPO's processor sees every row of the chunk, finished or not, with the ids so far, at every step; a
    token it bans is never drawn."""
    _, tokenizer, ids, mask = policy
    free = run(policy, temperature=0.0, eos_ids=[])
    banned = free.tokens[0][0]
    widths = []

    def ban(prompt_ids, prompt_mask):
        assert torch.equal(prompt_ids, ids) and torch.equal(prompt_mask, mask)

        def processor(input_ids, scores):
            widths.append(input_ids.shape)
            return scores.index_fill(-1, torch.tensor([banned]), float("-inf"))

        return processor

    eos = ragged_eos(policy, 1.0)
    out = run(policy, temperature=1.0, eos_ids=eos, generator=torch.Generator().manual_seed(0), logits_processor=ban)
    assert all(banned not in row for row in out.tokens)
    assert widths[0] == ids.shape and all(shape[0] == ids.shape[0] for shape in widths)
    assert [shape[1] for shape in widths] == list(range(ids.shape[1], ids.shape[1] + len(widths)))


def test_a_greedy_rollout_is_the_same_through_either_engine(policy):
    """rollout.generate's own loop and its model.generate path give the same Rollout at temperature 0."""
    model, tokenizer, ids, _ = policy
    prompts = [row[row != tokenizer.pad_token_id].tolist() for row in ids]
    stop = [tokenizer.decode(run(policy, temperature=0.0, eos_ids=[]).tokens[2][:3])[1:3]]
    ours, theirs = (
        generate(model, tokenizer, prompts, n=2, max_new_tokens=10, temperature=0.0, stop=stop, use_generate=use)
        for use in (False, True)
    )
    assert ours.completions == theirs.completions and ours.finished == theirs.finished
    assert torch.equal(ours.response_ids, theirs.response_ids) and torch.equal(ours.prompt_ids, theirs.prompt_ids)
    assert any(ours.finished) and not all(ours.finished)
