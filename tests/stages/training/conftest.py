"""Fixtures of the agent tests (GRPO's and PPO's on calculator episodes): the tiny model taught to call the
calculator, and the questions it plays. Module-scoped, so each module's one-thread fixture covers the fit."""

import pytest

from tests.rl.agent_helpers import teach_calculator, write_calculator_questions


@pytest.fixture(scope="module")
def calculator_model(tiny_model_dir, tmp_path_factory):
    return teach_calculator(tiny_model_dir, tmp_path_factory.mktemp("models") / "calculator")


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    return write_calculator_questions(tmp_path_factory.mktemp("rl") / "questions.jsonl")
