"""The embedded agent demo (``make demo-agent``): GRPO in a calculator environment teaches a tiny model to use
its tool.

    python -m trainer_lib.demo.agent --seed 0 --out runs/demo-agent/seed-0

Offline and deterministic, from one seed:

1. Arithmetic questions on numbers too large for a tiny model to compute (``What is "482 * 37"?``, operands
   of ``--digits`` digits), in three disjoint sets: SFT transcripts, GRPO prompts, held-out questions.
2. The SFT transcripts come from a careless teacher: in ``--guess`` of them it answers at once with a wrong
   number instead of calling the calculator, and in ``--malformed`` of its calls it names the argument
   wrongly (``expr``), which the environment refuses; a good call ends ``706 + 657 = 1363.``. SFT learns the
   habits along with the format, and so answers at once (greedily) before GRPO.
3. The tiny model (what ``posttrain tiny-model`` builds, its BPE trained on the transcripts) with
   :data:`TOOL_CHATML`, a ChatML template that renders tools; ``posttrain sft`` on the transcripts.
4. ``posttrain grpo`` from the SFT model with ``env.class=tools env.tools=calculator``: each episode is the
   question, the model's tool calls and their results, and its final answer, which ``accuracy_reward``
   checks against the question's solution.
5. The ablation, GRPO with the tools off: the same GRPO run from the same SFT model but single-turn, no tool
   offered, its first reply scored by ``accuracy_reward`` (``reward.functions``): what GRPO gains without
   the calculator.
6. SFT and both GRPO models play one greedy episode per held-out question (:func:`trainer_lib.eval.agent_episodes.
   play_episodes`, as ``posttrain evaluate env.path=...`` does): the success rate, the valid tool-call rate
   and the mean turns; and with no tools offered (:class:`AnswerOnly`), where the first reply is the answer.

Writes ``OUT/report.json`` and ``OUT/report.md`` and prints the table. A rerun skips the steps whose output
is there (the model directories, the evaluations), and ``posttrain`` resumes a stage from its last
checkpoint. Exits 1 when GRPO's held-out success is not ``--min-gain`` above SFT's.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import random
import sys
import time

from trainer_lib.demo.stage_runs import posttrain

#: ChatML with a tools block (a system turn naming them, short to keep sequences short) and the Hermes
#: ``<tool_call>`` convention. A tool's result is shown as ``= 1363``, as a calculator's display reads, and the
#: teacher answers ``706 + 657 = 1363.``: the ``= `` before both lets the tiny model find the number to copy.
TOOL_CHATML = (
    '{% if tools %}{{ \'<|im_start|>system\nCall a tool with <tool_call>{"name": ..., "arguments": ...}'
    "</tool_call>. Tools:' }}{% for tool in tools %}{{ ' ' + tool['function']['name'] }}{% endfor %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + ('= ' if message['role'] == 'tool' else '') + message['content']"
    " + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: The operations asked about.
OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
#: How a question is asked; ``{e}`` is the expression, quoted as the calculator call quotes it (``"706 + 657"``),
#: so that the tiny model finds the digits to copy by the same ``"`` before them.
PHRASINGS = ('What is "{e}"?', 'Compute "{e}".', 'Calculate "{e}", please.', 'How much is "{e}"?')
#: SFT's settings. What SFT must teach is copying: the question's expression into the call, the calculator's
#: result into the answer. With 4 heads (2 key-value), lr 3e-3, 600 transcripts and answers ``The answer is N.``
#: no held-out result was copied after 1,000 steps. In an SFT-only probe (half the teacher guessing) 8 heads and
#: lr 1e-3 copied 29 of 30 held-out results after 750 steps with the ``= `` marker, 0 of 30 without it; quoting
#: the expression then raised the copies from 5 of 40 (1,600 steps) to 18 of 40 (1,200 steps). Unpacked rows and
#: a constant rate had helped before (9 of 20 training transcripts against 1 and 0 of 20).
SFT = [
    "batch_size=16",
    "data.packing=false",
    "lr_scheduler=constant",
    "data.max_length=160",
    "data.eval_fraction=0",
    "save_steps=100",
]
GRPO = [
    "env.class=tools",
    "env.tools=calculator",
    "env.max_turns=3",
    "env.max_total_tokens=192",
    "rollout.n=8",
    "rollout.max_new_tokens=40",
    "rollout.temperature=0.7",  # at 1.0 the sampled copies of digits were too often wrong to earn a reward
    "lr_scheduler=constant",
    "beta=0.04",
    "data.eval_fraction=0",
    "save_steps=10",
    "logging_steps=5",
]
#: The ablation: GRPO's settings without the environment; the prompt's answer scored as the episode's is.
GRPO_NO_TOOLS = [s for s in GRPO if not s.startswith("env.")] + ["reward.functions=accuracy_reward"]
#: The models compared: the label, and the GRPO run's settings (None: the SFT model).
ARMS = {"sft": None, "grpo": GRPO, "grpo_no_tools": GRPO_NO_TOOLS}
#: The held-out episodes' limits (GRPO's).
MAX_TURNS, MAX_NEW_TOKENS, MAX_TOTAL_TOKENS = 3, 40, 192


def calculator_conversation(question: str, expression: str, answer: str, argument: str = "expression") -> list[dict]:
    """A question, the assistant's calculator call (its argument named ``argument``), the tool's result and the
    assistant's answer, which restates the expression (``706 + 657 = 1363.``)."""
    arguments = {"name": "calculator", "arguments": {argument: expression}}
    call = f"<tool_call>{json.dumps(arguments)}</tool_call>"
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": answer},
        {"role": "assistant", "content": f"{expression} = {answer}."},
    ]


def make_questions(count: int, digits: int, seed: int, avoid: set[str] = frozenset()) -> list[dict]:
    """``count`` distinct questions ``{question, expression, solution}``: two operands of ``digits`` digits
    (the second of ``digits - 1`` for products, so answers stay under ~2 * digits digits) and + - or *."""
    rng = random.Random(seed)
    low, high = 10 ** (digits - 1), 10**digits - 1
    seen, questions = set(avoid), []
    while len(questions) < count:
        op = rng.choice("+-*")
        a = rng.randint(low, high)
        b = rng.randint(low // 10 if op == "*" else low, high // 10 if op == "*" else high)
        expression = f"{a} {op} {b}"
        if expression in seen:
            continue
        seen.add(expression)
        question = rng.choice(PHRASINGS).format(e=expression)
        questions.append({"question": question, "expression": expression, "solution": str(OPERATORS[op](a, b))})
    return questions


def teacher_conversation(item: dict, guess: float, malformed: float, rng: random.Random) -> list[dict]:
    """The careless teacher's transcript of one question: a wrong guess (no call, in its own words) in ``guess`` of
    cases, else
    a calculator call, with its argument misnamed in ``malformed`` of those."""
    if rng.random() < guess:
        wrong = int(item["solution"]) + rng.choice([-1, 1]) * rng.randint(1, 10 ** max(len(item["solution"]) - 2, 1))
        return [
            {"role": "user", "content": item["question"]},
            {"role": "assistant", "content": f"I think it is {wrong}."},
        ]
    argument = "expr" if rng.random() < malformed else "expression"
    return calculator_conversation(item["question"], item["expression"], item["solution"], argument)


def write_data(out: str, args: argparse.Namespace) -> dict:
    """``sft.jsonl`` (teacher transcripts, the tools offered in each row's ``tools``), ``prompts.jsonl`` (GRPO's
    questions and solutions), ``heldout.jsonl`` and the tokenizer's ``corpus.txt`` under ``out``."""
    from trainer_lib.agents import calculator_tool

    tools = json.dumps([calculator_tool().schema])
    sft = make_questions(args.sft_rows, args.digits, args.seed * 3)
    prompts = make_questions(args.rl_rows, args.digits, args.seed * 3 + 1, {q["expression"] for q in sft})
    avoid = {q["expression"] for q in sft + prompts}
    heldout = make_questions(args.heldout_rows, args.digits, args.seed * 3 + 2, avoid)
    rng = random.Random(f"{args.seed}:teacher")
    files = {name: os.path.join(out, name) for name in ("sft.jsonl", "prompts.jsonl", "heldout.jsonl", "corpus.txt")}
    corpus, habits = [], {"guesses": 0, "malformed_calls": 0}
    with open(files["sft.jsonl"], "w", encoding="utf-8") as fh:
        for item in sft:
            messages = teacher_conversation(item, args.guess, args.malformed, rng)
            habits["guesses"] += len(messages) == 2
            habits["malformed_calls"] += '"expr"' in messages[1]["content"]
            fh.write(json.dumps({"messages": messages, "tools": tools}) + "\n")
            corpus += [f"{m['role']}\n{m['content']}" for m in messages]
    for name, items in (("prompts.jsonl", prompts), ("heldout.jsonl", heldout)):
        with open(files[name], "w", encoding="utf-8") as fh:
            for item in items:
                row = {"prompt": [{"role": "user", "content": item["question"]}], "solution": item["solution"]}
                fh.write(json.dumps(row) + "\n")
    with open(files["corpus.txt"], "w", encoding="utf-8") as fh:
        system = 'system\nCall a tool with <tool_call>{"name": ..., "arguments": ...}</tool_call>. Tools: calculator'
        fh.writelines(line + "\n" for line in [system, *corpus] * 4)
    return {**files, **habits}


def make_tool_model(out: str, texts: list[str], vocab: int, layers: int, hidden: int, heads: int, seed: int) -> str:
    """What ``posttrain tiny-model`` builds, with one digit per token (as Llama 3 and Qwen split numbers: a
    number is then the same tokens after a space, a quote or a newline, so copying it into a call is a
    token-for-token copy), ``heads`` attention heads (as many key-value heads) and :data:`TOOL_CHATML`."""
    from tokenizers import pre_tokenizers

    from trainer_lib.demo.tiny_model import build_tiny_llama, train_tokenizer

    tokenizer = train_tokenizer(texts, vocab_size=vocab)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.chat_template = TOOL_CHATML
    model = build_tiny_llama(
        tokenizer, num_layers=layers, hidden_size=hidden, num_heads=heads, num_kv_heads=heads, seed=seed
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class AnswerOnly:
    """The tools-off environment: the question with no tools offered; the model's first reply is its answer,
    scored by ``accuracy_reward``. A tool call there is text that answers nothing."""

    def __init__(self, checker):
        self.checker = checker

    def reset(self, row: dict):
        from trainer_lib.agents import Observation

        self.row = row
        return Observation(list(row["prompt"]))

    def step(self, assistant_message: dict):
        from trainer_lib.agents import StepResult

        return StepResult([], self.checker(assistant_message.get("content") or "", self.row), True, {})


def evaluate(model_dir: str, heldout: str, tools: bool, seed: int) -> dict:
    """One greedy episode per held-out question by the model in ``model_dir``, in the calculator environment
    (``tools``) or :class:`AnswerOnly`; the agent metrics and a few transcripts."""
    from trainer_lib.agents import ToolEnvironment, calculator_tool
    from trainer_lib.eval.agent_episodes import EpisodeSettings, agent_metrics, load_rows, play_episodes
    from trainer_lib.eval.generation import load_torch_engine
    from trainer_lib.rl.environments import answer_checker

    checker, _ = answer_checker("accuracy_reward")
    if tools:
        calculator = calculator_tool()

        def make_env():
            return ToolEnvironment([calculator], checker)
    else:

        def make_env():
            return AnswerOnly(checker)

    settings = EpisodeSettings(MAX_TURNS, MAX_NEW_TOKENS, MAX_TOTAL_TOKENS, "final", 1.0, 1.0)
    engine = load_torch_engine(model_dir, "fp32", "cpu")
    rows = play_episodes(engine, load_rows(heldout), make_env, settings, batch_size=64, seed=seed)
    engine.close()
    tried = [r["tool_calls"] + r["malformed_tool_calls"] for r in rows]
    calling = {"calls_tried": sum(tried), "calling_rate": sum(n > 0 for n in tried) / len(rows)}
    return {**agent_metrics(rows), **calling, "examples": [r["transcript"] for r in rows[:4]]}


def stage(name: str, out: str, settings: list[str]) -> float:
    """``posttrain <name>`` into ``out`` (:func:`~trainer_lib.demo.stage_runs.posttrain`), skipped when ``out``
    holds a finished model; its seconds."""
    if os.path.isfile(os.path.join(out, "model.safetensors")):
        print(f"agent demo: {os.path.basename(out)}: done before, skipped", flush=True)
        return 0.0
    return posttrain(name, out, settings, "agent demo")


def cached(path: str, compute) -> dict:
    """The JSON at ``path``, or ``compute()`` written there."""
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    value = compute()
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(value, fh, indent=1)
    return value


def run(args: argparse.Namespace) -> dict:
    """Every step in turn (module doc), each skipped when done before; what goes into report.json."""
    import torch
    from transformers.utils import logging as hf_logging

    from trainer_lib.demo.tiny_model import read_corpus

    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    out, seed, timings = args.out, args.seed, {}
    os.makedirs(out, exist_ok=True)
    data = cached(os.path.join(out, "data.json"), lambda: write_data(out, args))
    paths = {name: os.path.join(out, name) for name in ("base", *ARMS)}
    if not os.path.isfile(os.path.join(paths["base"], "config.json")):
        began = time.time()
        texts = read_corpus(data["corpus.txt"])
        make_tool_model(paths["base"], texts, args.vocab, args.layers, args.hidden, args.heads, seed)
        timings["tiny-model"] = time.time() - began
    sft = [f"seed={seed}", f"model.path={paths['base']}", f"data.path={data['sft.jsonl']}", *SFT]
    sft += [f"lr={args.sft_lr}", f"max_steps={args.sft_steps}", "logging_steps=20"]
    timings["sft"] = stage("sft", paths["sft"], sft)
    rl = [f"seed={seed}", f"model.path={paths['sft']}", f"data.path={data['prompts.jsonl']}"]
    rl += [f"prompts_per_step={args.prompts_per_step}", f"batch_size={args.prompts_per_step * 8}"]
    rl += [f"lr={args.rl_lr}", f"max_steps={args.rl_steps}"]
    for label, settings in ARMS.items():
        if settings is not None:
            timings[label] = stage("grpo", paths[label], rl + settings)
    began = time.time()
    models = {}
    for label in ARMS:
        models[label] = {
            mode: cached(
                os.path.join(out, f"eval-{label}-{mode}.json"),
                lambda label=label, mode=mode: evaluate(paths[label], data["heldout.jsonl"], mode == "tools", seed),
            )
            for mode in ("tools", "no_tools")
        }
    timings["evaluate"] = time.time() - began
    return {
        "seed": seed,
        "models": models,
        "data": {"sft": args.sft_rows, "grpo": args.rl_rows, "heldout": args.heldout_rows, "digits": args.digits},
        "teacher": {"guesses": data["guesses"], "malformed_calls": data["malformed_calls"]},
        "model": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads},
        "settings": {
            "sft_steps": args.sft_steps,
            "sft_lr": args.sft_lr,
            "rl_steps": args.rl_steps,
            "rl_lr": args.rl_lr,
        },
        "seconds": add_seconds(out, timings),
    }


def add_seconds(out: str, timings: dict) -> dict:
    """Each step's seconds over every run in ``out`` (``OUT/seconds.json``): this run's for the steps that did
    work, the earlier runs' for those it skipped, and their sum as ``total``."""
    path = os.path.join(out, "seconds.json")
    seconds = {}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            seconds = json.load(fh)
    seconds.update({key: round(value, 1) for key, value in timings.items() if value >= 1})
    seconds["total"] = round(sum(value for key, value in seconds.items() if key != "total"), 1)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(seconds, fh, indent=1)
    return seconds


def table(result: dict) -> str:
    """The before/after table, in markdown: the valid tool-call rate of a model that tried no call is "none tried"
    (agent_valid_tool_call_rate is 0 then)."""
    lines = [
        "| model | success (tools) | episodes calling | valid tool calls | mean turns | success (no tools) |",
        "|---|---|---|---|---|---|",
    ]
    for label, m in result["models"].items():
        on, off = m["tools"], m["no_tools"]
        valid = f"{on['agent_valid_tool_call_rate']:.2f}" if on["calls_tried"] else "none tried"
        lines.append(
            f"| {label} | {on['agent_success_rate']:.2f} | {on['calling_rate']:.2f} | {valid} "
            f"| {on['agent_mean_turns']:.2f} | {off['agent_success_rate']:.2f} |"
        )
    return "\n".join(lines)


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer_lib.demo.agent", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="Seed of the questions, the model and every stage.")
    parser.add_argument("--out", default="runs/demo-agent/seed-0", help="Where everything goes (a rerun resumes).")
    parser.add_argument("--digits", type=int, default=3, help="Digits of the operands.")
    parser.add_argument("--sft-rows", type=int, default=4000, help="Teacher transcripts for SFT.")
    parser.add_argument("--rl-rows", type=int, default=400, help="GRPO's questions.")
    parser.add_argument("--heldout-rows", type=int, default=200, help="Held-out questions.")
    parser.add_argument("--guess", type=float, default=0.7, help="Share of transcripts where the teacher guesses.")
    parser.add_argument("--malformed", type=float, default=0.2, help="Share of the teacher's calls misnamed.")
    parser.add_argument("--vocab", type=int, default=512, help="The tiny model's BPE vocabulary.")
    parser.add_argument("--layers", type=int, default=2, help="The tiny model's layers.")
    parser.add_argument("--hidden", type=int, default=128, help="The tiny model's hidden size.")
    parser.add_argument("--heads", type=int, default=8, help="The tiny model's attention (and key-value) heads.")
    parser.add_argument("--sft-steps", type=int, default=2400, help="SFT optimizer steps.")
    parser.add_argument("--sft-lr", type=float, default=1e-3, help="SFT learning rate.")
    parser.add_argument("--rl-steps", type=int, default=60, help="GRPO steps.")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="GRPO questions per step (8 episodes each).")
    parser.add_argument("--rl-lr", type=float, default=3e-4, help="GRPO learning rate.")
    parser.add_argument("--min-gain", type=float, default=0.20, help="Least rise of held-out success over SFT.")
    args = parser.parse_args(argv)
    for name in ("guess", "malformed"):
        if not 0 <= getattr(args, name) <= 1:
            parser.error(f"--{name}: expected a share between 0 and 1, got {getattr(args, name)}")
    if args.digits < 2:
        parser.error(f"--digits: expected at least 2, got {args.digits}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    result = run(args)
    models = result["models"]
    sft, grpo = (models[k]["tools"]["agent_success_rate"] for k in ("sft", "grpo"))
    result["gain"] = grpo - sft
    off = models["grpo_no_tools"]["no_tools"]["agent_success_rate"] - models["sft"]["no_tools"]["agent_success_rate"]
    result["gain_without_tools"] = off
    result["passed"] = result["gain"] >= args.min_gain
    text = table(result)
    heldout, seconds = result["data"]["heldout"], result["seconds"]["total"]
    header = (
        f"held-out questions (seed {args.seed}, {heldout} questions, {args.digits}-digit operands, {seconds:.0f} s)"
    )
    verdict = "holds" if result["passed"] else "does NOT hold"
    footer = (
        f"GRPO - SFT success = {result['gain']:+.2f}: the goal (>= {args.min_gain:+.2f}) {verdict}; "
        f"GRPO with the tools off - SFT, both without tools = {off:+.2f}"
    )
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as fh:
        fh.write(f"{header}\n\n{text}\n\n{footer}\n")
    print(f"\n{header}\n{text}\n{footer} ({args.out}/report.md)")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: the demo is offline
    sys.exit(main())
