"""A reward source for tests/sandbox/test_sandbox_grpo.py: the library's ``code_execution`` reward, scoring
for each prompt the hostile corpus program of its ``program`` column (first completion of a group)
and an honest solution (second completion) in place of what the tiny policy wrote.

Each call's rewards are appended, as one JSON line, to the file named by ``CORPUS_VERDICTS``.
"""

import json
import os

from trainer_lib.rewards.functions import CodeExecution

HONEST = "def add(a, b):\n    return a + b\n"


class CorpusExecution(CodeExecution):
    def __call__(self, prompts, completions, *, tests, program, **columns):
        texts = [program[i] if i % 2 == 0 else HONEST for i in range(len(completions))]
        rewards = super().__call__(prompts, texts, tests=tests)
        with open(os.environ["CORPUS_VERDICTS"], "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rewards) + "\n")
        return rewards


reward = CorpusExecution(timeout=1.5, max_workers=4)
