"""What the multi-turn rollout and agentic GRPO tests share: scripted environments, a model whose next token is
forced by its position, and a tiny model taught to call the calculator (with the agent demo's ChatML template
that renders tools, :data:`trainer_lib.demo.agent.TOOL_CHATML`)."""

from __future__ import annotations

import json

import torch

from trainer_lib.agents import Observation, StepResult
from trainer_lib.demo.agent import TOOL_CHATML, calculator_conversation


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


#: Questions the taught model answers with the calculator, and their solutions.
CALCULATOR_QUESTIONS = (("What is 2+3?", "2+3", "5"), ("What is 4*6?", "4*6", "24"))


def teach_calculator(base_dir: str, out_dir: str, steps: int = 150) -> str:
    """The tiny model of ``base_dir`` fitted to :data:`CALCULATOR_QUESTIONS`' conversations (loss on the
    assistant's turns), saved with :data:`TOOL_CHATML`: greedily it calls the calculator and then answers;
    sampled, it sometimes writes a broken call or a wrong answer, so a group's rewards differ."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer_lib.agents import calculator_tool

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    tokenizer.chat_template = TOOL_CHATML
    tools = [calculator_tool().schema]
    rows, labels = [], []
    for question in CALCULATOR_QUESTIONS:
        messages = calculator_conversation(*question)
        encoded = tokenizer(
            tokenizer.apply_chat_template(messages, tools=tools, tokenize=False),
            add_special_tokens=False,
            return_offsets_mapping=True,
        )
        spans = [
            (
                len(
                    tokenizer.apply_chat_template(messages[:i], tools=tools, tokenize=False, add_generation_prompt=True)
                ),
                len(tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False).rstrip("\n")),
            )
            for i, message in enumerate(messages)
            if message["role"] == "assistant"
        ]
        rows.append(encoded["input_ids"])
        offsets = encoded["offset_mapping"]
        labels.append([t if any(s <= a and b <= e for s, e in spans) else -100 for t, (a, b) in zip(rows[-1], offsets)])
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
    targets = torch.tensor([t + [-100] * (width - len(t)) for t in labels])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(base_dir)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        for _ in range(steps):
            model(input_ids=ids, attention_mask=mask, labels=targets).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return str(out_dir)


#: ``posttrain grpo`` in the calculator's ToolEnvironment: 2 questions x 4 episodes per step of at most 3 turns
#: of 96 tokens; the final answer scored by the environment's checker (accuracy_reward) and, beside it, by the
#: reward function accuracy_reward.
AGENT_GRPO = (
    "env.class=tools",
    "env.tools=calculator",
    "env.max_turns=3",
    "env.max_total_tokens=400",
    "reward.functions=accuracy_reward",
    "rollout.n=4",
    "prompts_per_step=2",
    "rollout.max_new_tokens=96",
    "batch_size=4",
    "data.eval_fraction=0",
    "lr=1e-3",
    "seed=3",
)


def write_calculator_questions(path) -> str:
    """:data:`CALCULATOR_QUESTIONS` as GRPO prompt rows with their ``solution``; the path."""
    with open(path, "w", encoding="utf-8") as fh:
        for question, _, answer in CALCULATOR_QUESTIONS:
            fh.write(json.dumps({"prompt": [{"role": "user", "content": question}], "solution": answer}) + "\n")
    return str(path)
