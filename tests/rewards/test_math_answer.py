"""accuracy_reward and think_format_reward (TRL's names): answers read by hand-checked rules, compared by
math-verify, with bounded work on hostile completions."""

import time

import pytest

from trainer_lib.errors import UserError
from trainer_lib.rewards.functions import BUILTINS, resolve, think_format_reward
from trainer_lib.rewards.math_answer import AccuracyReward, final_answer, gold_answer, last_boxed, last_number


@pytest.fixture(scope="module")
def accuracy():
    return AccuracyReward()


@pytest.mark.parametrize(
    "text, answer",
    [
        (r"so the answer is \boxed{\frac{1}{3}}.", r"\frac{1}{3}"),
        (r"first \boxed{2}, then correcting myself: \boxed{ {3}+1 }", "{3}+1"),  # the last box, braces matched
        (r"\fbox{7} at the end", "7"),
        ("She has 3 apples, then 4 more: 7 apples.", "7"),
        ("Total: 1,234,567 dollars", "1234567"),
        ("The ratio is -3/4", "-3/4"),
        ("x = 2.50.", "2.50"),
        ("no numbers here", None),
        (r"an unclosed \boxed{12 and then 5", "5"),  # no complete box: the last number
    ],
)
def test_final_answer(text, answer):
    assert final_answer(text) == answer


@pytest.mark.parametrize(
    "solution, gold",
    [
        (r"\frac{1}{3}", r"\frac{1}{3}"),
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),  # GSM8K's answer marker
        (r"We add them, so \boxed{10}.", "10"),
        ("  ", None),
        ("x" * 500, None),  # a long worked solution without a marked answer: nothing to compare
    ],
)
def test_gold_answer(solution, gold):
    assert gold_answer(solution) == gold


def test_accuracy_reward_by_hand(accuracy):
    completions = [
        r"Thus \boxed{\frac{1}{3}}",  # exact
        r"Thus \boxed{\frac{1}{2}}",  # wrong
        "1/3 of them, so 0.5",  # the last number is the answer: wrong
        "It is one third.",  # no answer at all
        [{"role": "assistant", "content": "The answer is 0.5"}],  # a chat completion; 0.5 == 1/2
        "so we get 72 clips",
        "anything",
    ]
    solutions = [r"\frac{1}{3}", r"\frac{1}{3}", r"\frac{1}{3}", r"\frac{1}{3}", r"\frac{1}{2}", "#### 72", None]
    assert accuracy([None] * 7, completions, solution=solutions) == [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, None]


def test_an_unreadable_solution_does_not_apply_and_a_missing_column_is_an_error(accuracy):
    assert accuracy(["p"], [r"\boxed{1}"], solution=["#### "]) == [None]
    with pytest.raises(UserError, match="no 'solution' column"):
        accuracy(["p"], ["1"], tests=[["assert True"]])


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_hostile_completions_cost_little(accuracy):
    hostile = [
        r"\boxed{9^{9^{9^{9}}}}",  # a tower SymPy would try to evaluate
        r"\boxed{(10^{10})!}",
        r"\boxed{2^{10000000000}}",
        "\\boxed{" * 200_000,  # unclosed boxes everywhere
        "{" * 1_000_000 + "1" * 1_000_000,  # a 2 MB completion: only its tail is searched for a number
        r"\boxed{" + "1+" * 5_000 + "1}",  # a box longer than an answer can be
    ]
    start = time.perf_counter()
    assert accuracy([None] * len(hostile), hostile, solution=["3"] * len(hostile)) == [0.0] * len(hostile)
    assert time.perf_counter() - start < 2.0
    assert last_boxed("\\boxed{" * 200_000) is None and last_number("9" * 10_000, window=50) == "9" * 50


def test_reasoning_accuracy_reads_only_what_follows_the_reasoning():
    _, reasoning = resolve("reasoning_accuracy_reward")
    completions = [
        r"<think>maybe \boxed{3}</think> so \boxed{4}",
        r"<think>4, surely</think> no, it is 5",
        r"<think>it is \boxed{4} but I am still thinking",  # unfinished reasoning: 0, even if right
    ]
    assert reasoning([None] * 3, completions, solution=["4"] * 3) == [1.0, 0.0, 0.0]


def test_think_format_reward():
    completions = [
        "<think>\nreasoning\n</think>\nThe answer is 4.",
        "<think>reasoning</think>",  # an empty answer still counts, as in TRL
        "<think>\nreasoning without an end",
        "The answer first <think>then</think>",
        "<think>one<think>two</think> answer",
        [{"role": "assistant", "content": "<think>a</think>b"}],
    ]
    assert think_format_reward([None] * 6, completions) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]


def test_both_are_built_ins_by_their_trl_names():
    assert {"accuracy_reward", "think_format_reward"} <= set(BUILTINS)
    name, fn = resolve("accuracy_reward")
    assert name == "accuracy_reward" and fn(["p"], ["= 4"], solution=["4"]) == [1.0]
    assert resolve("think_format_reward")[1] is think_format_reward
