"""What the multi-turn rollout and agentic GRPO tests share: a ChatML template that renders tools, scripted
environments, and a model whose next token is forced by its position."""

from __future__ import annotations

import torch

from trainer_lib.agents import Observation, StepResult

#: ChatML with a tools block (a system turn listing the schemas) and the Hermes <tool_call> convention.
TOOL_CHATML = (
    '{% if tools %}{{ \'<|im_start|>system\nCall a tool with <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>. Tools:\n' }}{% for tool in tools %}{{ tool | tojson }}{{ '\n' }}{% endfor %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class CountingEnv:
    """A scripted environment: the row's ``prompt`` as the user turn; each step answers with a tool message of
    ``size`` x's, rewards the step's number (1, 2, ...) and ends the episode after ``stop`` steps."""

    def reset(self, row: dict) -> Observation:
        self.row, self.steps = row, 0
        return Observation([{"role": "user", "content": row["prompt"]}])

    def step(self, assistant_message: dict) -> StepResult:
        self.steps += 1
        content = "x" * self.row.get("size", 3)
        done = self.steps >= self.row.get("stop", 99)
        return StepResult([{"role": "tool", "content": content}], float(self.steps), done, {"seen": assistant_message})


class ForcedModel(torch.nn.Module):
    """A causal LM whose next token is ``script[p % len(script)]``, ``p`` being the number of tokens before it
    (the attention mask's sum), whatever it was given: what it samples is known in advance."""

    def __init__(self, inner, script: list[int]):
        super().__init__()
        self.inner, self.script = inner, script
        self.config, self.generation_config = inner.config, inner.generation_config

    def forward(self, **inputs):
        out = self.inner(**inputs)
        positions = inputs["attention_mask"].sum(1).tolist()
        forced = torch.tensor([self.script[p % len(self.script)] for p in positions])
        logits = torch.full_like(out.logits, -1e4)
        logits[torch.arange(len(forced)), -1, forced] = 1e4
        out.logits = logits
        return out
