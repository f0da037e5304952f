"""The length reward of tests/rewards/length_reward.py, raising the audit event ``tests.hold`` with its
call number first: :mod:`tests.paused_cli` (event ``audit``) can then hold a stage in the middle of a
given step (one call per step), for a test to send it a signal there."""

import sys

from tests.rewards.length_reward import reward as length_reward

calls = 0


def reward(prompts, completions, **columns):
    global calls
    calls += 1
    sys.audit("tests.hold", str(calls))
    return length_reward(prompts, completions, **columns)
