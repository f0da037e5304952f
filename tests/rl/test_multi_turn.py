"""Multi-turn rollouts: the model's tokens as sampled, the environment's rendered alone and masked, one KV
cache across turns (each token forwarded once, greedy output equal to re-prefilling every turn), the limits."""

import pytest
import torch

from tests.rl.agent_helpers import CountingEnv, ForcedModel
from trainer_lib.demo.agent import TOOL_CHATML
from trainer_lib.rl.multi_turn import EnvironmentSuffix, episode_metrics, episode_sums, generate_episodes
from trainer_lib.rl.rollout import generate, token_logprobs

pytestmark = pytest.mark.usefixtures("single_thread")

ROWS = [{"prompt": "Say hello."}, {"prompt": "What is two plus two? Name a color."}]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.chat_template = TOOL_CHATML
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), tokenizer


def chatml_suffix(content: str, closed: bool = True) -> str:
    """The environment's tool message as TOOL_CHATML writes it after an assistant turn's <|im_end|> (a tool's
    result after ``= ``, as a calculator's display shows it)."""
    return ("" if closed else "<|im_end|>") + f"\n<|im_start|>tool\n= {content}<|im_end|>\n<|im_start|>assistant\n"


def spans(rollout, row: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the model's turns, the environment's stretches between them) of a row, in response positions."""
    turns = rollout.episodes[row].turns
    return turns, [(a[1], b[0]) for a, b in zip(turns, turns[1:])]


def test_environment_messages_are_rendered_alone(policy):
    _, tokenizer = policy
    end = {"<|im_end|>": tokenizer.eos_token_id}
    tool = [{"role": "tool", "content": "42"}]
    assert EnvironmentSuffix(tokenizer, end).text(tool, []) == chatml_suffix("42")
    schema = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}
    assert EnvironmentSuffix(tokenizer, end).text(tool, [schema]) == chatml_suffix("42")  # the tools' block cancels
    two = [*tool, {"role": "user", "content": "Sure?"}]
    both = chatml_suffix("42")[: -len("<|im_start|>assistant\n")] + "<|im_start|>user\nSure?<|im_end|>\n"
    assert EnvironmentSuffix(tokenizer, end).text(two, []) == both + "<|im_start|>assistant\n"
    # a template that adds a default system prompt to every conversation (SmolLM2's does): it cancels too
    tokenizer = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = (
        "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
        + TOOL_CHATML
    )
    suffix = EnvironmentSuffix(tokenizer, end)
    assert suffix.text(tool, []) == chatml_suffix("42")
    ids = suffix.ids(tool, [], closed=False)  # a turn cut before its end-of-turn token gets it first
    assert ids[0] == tokenizer.eos_token_id and tokenizer.decode(ids) == chatml_suffix("42", closed=False)


def test_trained_ids_are_the_sampled_ids_and_environment_tokens_are_masked(policy):
    """A model forced to spell "Hello" a letter at a time: the rollout keeps those ids, which re-tokenizing the
    text would not give, with action_mask 1; the environment's messages are there as rendered alone, mask 0."""
    model, tokenizer = policy
    letters = [tokenizer.convert_tokens_to_ids(c) for c in "Hello"]
    script = letters + [tokenizer.eos_token_id]
    forced = ForcedModel(model, script)
    rows = [{**ROWS[0], "size": 4}, {**ROWS[1], "size": 9}]
    rollout = generate_episodes(forced, tokenizer, rows, CountingEnv, n=2, max_turns=3, max_new_tokens=4, seed=3)
    drifted = 0
    for row in range(len(rollout)):
        prompt = int(rollout.prompt_mask[row].sum())
        ids, action = rollout.response_ids[row].tolist(), rollout.action_mask[row].tolist()
        turns, between = spans(rollout, row)
        assert len(turns) == 3 and rollout.episodes[row].episode.done_reason == "max_turns"
        for start, stop in turns:
            assert ids[start:stop] == [script[(prompt + p) % len(script)] for p in range(start, stop)]
            assert action[start:stop] == [1] * (stop - start)
            text = tokenizer.decode(ids[start:stop], skip_special_tokens=True)
            drifted += tokenizer(text, add_special_tokens=False)["input_ids"] != [i for i in ids[start:stop] if i != 3]
        for (start, stop), (_, turn_end) in zip(between, turns):
            closed = ids[turn_end - 1] == tokenizer.eos_token_id
            assert tokenizer.decode(ids[start:stop]) == chatml_suffix("x" * rows[row // 2]["size"], closed)
            assert action[start:stop] == [0] * (stop - start)
        assert int(rollout.response_mask[row].sum()) == turns[-1][1] and rollout.loss_mask is rollout.action_mask
        # what the environment read: the turn's text without its end-of-turn token
        seen = [info["seen"]["content"] for info in rollout.episodes[row].episode.infos]
        assert seen == [tokenizer.decode(ids[a:b], skip_special_tokens=True) for a, b in turns]
    assert drifted > 0  # re-tokenizing the text would have trained other ids
    assert rollout.stats["generated_tokens"] == int(rollout.action_mask.sum())


def test_each_turn_forwards_only_its_new_tokens(policy):
    """Every token of every trajectory goes through the model once (the prompt once per group of n), and a
    turn after the first forwards just the last sampled token and the environment's suffix of each episode."""
    model, tokenizer = policy
    forced = ForcedModel(model, [tokenizer.convert_tokens_to_ids(c) for c in "Hello"] + [tokenizer.eos_token_id])
    forwards = []

    def count(module, args, kwargs):
        width = kwargs["input_ids"].shape[1]
        forwards.append((width, int(kwargs["attention_mask"][:, -width:].sum())))

    hook = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        rollout = generate_episodes(forced, tokenizer, ROWS, CountingEnv, n=2, max_turns=3, max_new_tokens=5, seed=0)
    finally:
        hook.remove()
    prompts = rollout.prompt_mask.sum(1).tolist()
    responses = rollout.response_mask.sum(1).tolist()
    # each trajectory but its last sampled token; the n=2 copies of a prompt share its prefill but the last token
    expected = sum(p + r - 1 for p, r in zip(prompts, responses)) - sum(p - 1 for p in prompts[1::2])
    assert sum(valid for _, valid in forwards) == expected
    wide = [valid for width, valid in forwards if width > 1]
    assert wide[0] == sum(p - 1 for p in prompts[::2])  # the shared prompt prefill
    for turn in (1, 2):  # turns 2 and 3: one token of the model's and the environment's suffix, per episode
        news = [1 + b - a for row in range(len(rollout)) for a, b in spans(rollout, row)[1][turn - 1 : turn]]
        assert wide[turn] == sum(news)


def reprefilled_episode(model, tokenizer, row: dict, max_turns: int, max_new_tokens: int) -> list[int]:
    """The reference: one episode, the whole trajectory prefilled again every turn by ``generate``."""
    from trainer_lib.agents import Episode

    episode = Episode(CountingEnv(), row, max_turns)
    prompt = tokenizer(tokenizer.apply_chat_template(episode.messages, tokenize=False, add_generation_prompt=True))
    prompt, response = prompt["input_ids"], []
    suffix = EnvironmentSuffix(tokenizer, {"<|im_end|>": tokenizer.eos_token_id})
    while True:
        turn = generate(model, tokenizer, [prompt + response], max_new_tokens=max_new_tokens, temperature=0.0)
        tokens = turn.response_ids[0, : int(turn.response_mask[0].sum())].tolist()
        response += tokens
        seen = len(episode.messages)
        episode.advance({"content": turn.completions[0]})
        if episode.finished:
            return response
        response += suffix.ids(episode.messages[seen + 1 :], [], closed=turn.finished[0])


def test_greedy_episodes_equal_prefilling_every_turn_again(policy):
    """The one cache across turns, with its holes and dropped rows, is exact: greedy episodes equal those
    re-prefilled from scratch every turn, episodes of different lengths in one batch."""
    model, tokenizer = policy
    rows = [{**ROWS[0], "stop": 1}, {**ROWS[1], "size": 7}, {"prompt": "Blue", "stop": 2, "size": 30}]
    rollout = generate_episodes(model, tokenizer, rows, CountingEnv, max_turns=3, max_new_tokens=6, temperature=0.0)
    assert [len(t.turns) for t in rollout.episodes] == [1, 3, 2]
    for i, row in enumerate(rows):
        reference = reprefilled_episode(model, tokenizer, row, max_turns=3, max_new_tokens=6)
        assert rollout.response_ids[i, : int(rollout.response_mask[i].sum())].tolist() == reference


def test_sampling_is_seeded_and_its_logprobs_are_the_trained_forwards(policy):
    model, tokenizer = policy
    torch.manual_seed(5)
    before = torch.get_rng_state()
    settings = dict(n=3, max_turns=2, max_new_tokens=6, temperature=1.0, top_k=50, top_p=0.95, record_logprobs=True)
    a = generate_episodes(model, tokenizer, ROWS, CountingEnv, seed=1, **settings)
    assert torch.equal(torch.get_rng_state(), before)
    b = generate_episodes(model, tokenizer, ROWS, CountingEnv, seed=1, **settings)
    c = generate_episodes(model, tokenizer, ROWS, CountingEnv, seed=2, **settings)
    assert torch.equal(a.response_ids, b.response_ids) and not torch.equal(a.response_ids[:, :6], c.response_ids[:, :6])
    assert len({tuple(r) for r in a.response_ids[:3, :6].tolist()}) > 1  # the n episodes of a row differ
    # the sampler's log-probs are those of a full forward over the trajectory, at the model's tokens
    logprobs, _ = token_logprobs(model, a, temperature=1.0)
    mask = a.action_mask.bool()
    assert torch.allclose(logprobs[mask], a.logprobs[mask], atol=1e-4)
    assert (a.logprobs[~mask] == 0).all()


def test_done_reasons_step_rewards_and_the_token_budget(policy):
    """done, max_turns and max_total_tokens; per-step rewards and discounted returns; a turn cut by the budget
    is kept but not stepped; an episode whose environment reply would not leave room for a turn ends."""
    model, tokenizer = policy
    forced = ForcedModel(model, [tokenizer.convert_tokens_to_ids("H")])  # never ends a turn by itself
    rows = [{**ROWS[0], "stop": 1}, {**ROWS[1], "size": 5}]
    free = generate_episodes(forced, tokenizer, rows, CountingEnv, max_turns=3, max_new_tokens=4, gamma=0.5)
    done, capped = free.episodes
    assert (done.episode.done_reason, done.episode.rewards, done.turns) == ("done", [1.0], [(0, 4)])
    assert (capped.episode.done_reason, capped.episode.rewards) == ("max_turns", [1.0, 2.0, 3.0])
    assert capped.episode.returns == [1.0 + 0.5 * 2.0 + 0.25 * 3.0, 2.0 + 0.5 * 3.0, 3.0]
    assert (capped.reward("final"), capped.reward("sum")) == (3.0, 2.75)
    assert free.finished == [True, False] and free.completions == ["HHHH", "HHHH"]
    prompt, second = int(free.prompt_mask[1].sum()), capped.turns[1][0]
    row = [rows[1]]
    # room for 2 tokens of turn 2: it is cut there, kept, and not stepped (reward 0)
    cut = generate_episodes(
        forced, tokenizer, row, CountingEnv, max_turns=3, max_new_tokens=4, max_total_tokens=prompt + second + 2
    )
    episode = cut.episodes[0]
    assert (episode.episode.done_reason, episode.episode.rewards, episode.turns) == (
        "max_total_tokens",
        [1.0, 0.0],
        [(0, 4), (second, second + 2)],
    )
    assert int(cut.prompt_mask.sum() + cut.response_mask.sum()) == prompt + second + 2
    # the environment's reply leaves no room for a token: the episode ends after turn 1, the reply not appended
    full = generate_episodes(
        forced, tokenizer, row, CountingEnv, max_turns=3, max_new_tokens=4, max_total_tokens=prompt + second
    )
    assert (full.episodes[0].episode.done_reason, full.episodes[0].episode.rewards) == ("max_total_tokens", [1.0])
    assert int(full.response_mask.sum()) == 4
    # a prompt over the budget: no turn at all
    none = generate_episodes(forced, tokenizer, row, CountingEnv, max_total_tokens=prompt)
    assert none.episodes[0].episode.done_reason == "max_total_tokens" and none.response_ids.shape[1] == 0
    metrics = episode_metrics(episode_sums(free.episodes, free.action_mask, free.response_mask))
    assert metrics["episode/turns"] == 2.0 and metrics["episode/done_done"] == metrics["episode/done_max_turns"] == 0.5
    assert metrics["episode/env_tokens"] == (free.response_mask.sum() - free.action_mask.sum()).item() / 2
