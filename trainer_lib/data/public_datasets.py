"""Three public datasets' own row shapes, turned into normalized rows: Anthropic's HH-RLHF, OpenAI's
GSM8K and Google's MBPP.

Pure Python, like :mod:`trainer_lib.data.formats`, which detects them (``hh_rlhf`` by the values of
``chosen``, the other two by their columns) and lists them in ``SOURCE_FORMATS``.

``hh_rlhf``: ``chosen`` and ``rejected`` are whole dialogues, ``"\\n\\nHuman: ...\\n\\nAssistant: ..."``.
They become a conversational ``preference`` row, as TRL's conversational preference format: the shared
turns before the last answer are the ``prompt`` (user and assistant messages), each last assistant
answer is ``chosen``/``rejected`` (one message). Turns must alternate, starting with Human and ending
with Assistant, and both dialogues must share every turn before the last answer.

``gsm8k``: ``question`` and ``answer`` (a worked solution ending in ``#### 72``) become a
``prompt_completion`` row: the question as a user turn, the whole answer as the assistant turn, and a
``solution`` column holding the number after ``####`` (thousands commas dropped), the column TRL's
``accuracy_reward`` reads.

``mbpp``: ``text``, ``code``, ``test_list`` and ``test_setup_code`` become a ``prompt_completion`` row
with a ``tests`` column (the column ``code_execution`` and the evaluation's tasks read): the prompt is
the task text and its first test (the function's name and arguments), as MBPP's prompt shows its
tests; the completion is the code (Windows line ends made ``\\n``); each test is the setup code and then
one assert, run after the program.

Other columns (``task_id``, ...) are kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from trainer_lib.errors import DataError

#: the source formats of this module -> the normalized format their rows become.
TARGETS = {"hh_rlhf": "preference", "gsm8k": "prompt_completion", "mbpp": "prompt_completion"}

#: a speaker's mark in an HH-RLHF dialogue; the text between two marks is that speaker's turn.
_TURN = re.compile(r"\n\n(Human|Assistant):")
_ROLES = {"Human": "user", "Assistant": "assistant"}
_DIALOGUE = "a dialogue whose turns alternate '\\n\\nHuman: ...' and '\\n\\nAssistant: ...'"
#: a thousands comma between digits (``1,080``).
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
#: what MBPP's prompt says before its test.
MBPP_TEST_HINT = "Your code should pass this test:"


def is_hh_dialogue(value) -> bool:
    """Whether ``value`` is a dialogue string in HH-RLHF's form (it starts with a Human turn)."""
    return isinstance(value, str) and value.lstrip().startswith("Human:")


def converter(fmt: str) -> Callable[[Mapping, str], dict]:
    """``convert(row, location) -> a row of TARGETS[fmt]``."""
    return {"hh_rlhf": hh_rlhf_row, "gsm8k": gsm8k_row, "mbpp": mbpp_row}[fmt]


def _rest(row: Mapping, used: tuple[str, ...], out: dict) -> dict:
    """``out`` followed by the row's other columns."""
    return {**out, **{k: v for k, v in row.items() if k not in used and k not in out}}


def _string(row: Mapping, column: str, location: str) -> str:
    value = row.get(column)
    if not isinstance(value, str):
        raise DataError(location, column, "string", value)
    return value


def _lines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


# --------------------------------------------------------------------------- HH-RLHF


def dialogue_turns(text, field: str, location: str) -> list[dict]:
    """The messages of one HH-RLHF dialogue: user and assistant in turn, from user to assistant, each
    turn's text stripped. A :class:`DataError` names ``field`` otherwise."""
    if not is_hh_dialogue(text):
        raise DataError(location, field, f"{_DIALOGUE}, starting with Human", text)
    parts = _TURN.split("\n\n" + text.lstrip())
    messages = []
    for i in range(1, len(parts), 2):
        speaker, content = parts[i], parts[i + 1].strip()
        expected = "Human" if len(messages) % 2 == 0 else "Assistant"
        if speaker != expected:
            why = "a dialogue starts with Human" if not messages else f"a second {speaker} turn in a row"
            raise DataError(
                location, field, f"{_DIALOGUE} (turn {len(messages) + 1} is {why})", f"{speaker}: {content}"
            )
        messages.append({"role": _ROLES[speaker], "content": content})
    if messages[-1]["role"] != "assistant":
        raise DataError(location, field, f"{_DIALOGUE}, ending with an Assistant answer", f"Human: {content}")
    return messages


def hh_rlhf_row(row: Mapping, location: str) -> dict:
    """A conversational preference row: the shared turns are the prompt, the last answers chosen/rejected."""
    if not isinstance(row, Mapping):
        raise DataError(location, None, "an object with named columns", row)
    chosen = dialogue_turns(row.get("chosen"), "chosen", location)
    rejected = dialogue_turns(row.get("rejected"), "rejected", location)
    prompt = chosen[:-1]
    if rejected[:-1] != prompt:
        turn = next((i for i, (a, b) in enumerate(zip(prompt, rejected)) if a != b), min(len(prompt), len(rejected)))
        differs = rejected[turn] if turn < len(rejected) - 1 else rejected[-1]
        raise DataError(
            location,
            "rejected",
            f"the same turns as 'chosen' before the last Assistant answer (turn {turn + 1} differs; chosen has "
            f"{len(prompt)} turns before its answer, rejected {len(rejected) - 1})",
            differs["content"],
        )
    out = {"prompt": prompt, "chosen": chosen[-1:], "rejected": rejected[-1:]}
    return _rest(row, ("chosen", "rejected"), out)


# --------------------------------------------------------------------------- GSM8K


def gsm8k_solution(answer: str) -> str | None:
    """The final answer after a worked solution's last ``####``, thousands commas dropped; None without one."""
    head, mark, final = answer.rpartition("####")
    final = _THOUSANDS.sub("", final.strip())
    return final if mark and final else None


def gsm8k_row(row: Mapping, location: str) -> dict:
    """The question as a user turn, the worked answer as the assistant's, its final answer as ``solution``."""
    if not isinstance(row, Mapping):
        raise DataError(location, None, "an object with named columns", row)
    question = _string(row, "question", location)
    answer = _string(row, "answer", location)
    solution = gsm8k_solution(answer)
    if solution is None:
        raise DataError(
            location,
            "answer",
            "a worked solution ending in '#### <final answer>', as GSM8K's (other question/answer rows: "
            "data.columns='{prompt: question, response: answer}')",
            answer,
        )
    out = {
        "prompt": [{"role": "user", "content": question}],
        "completion": [{"role": "assistant", "content": answer}],
        "solution": solution,
    }
    return _rest(row, ("question", "answer"), out)


# --------------------------------------------------------------------------- MBPP


def mbpp_prompt(text: str, first_test: str) -> str:
    """The task and one of its tests, which shows the function's name and arguments."""
    return f"{text.strip()}\n{MBPP_TEST_HINT}\n\n{first_test.strip()}"


def mbpp_row(row: Mapping, location: str) -> dict:
    """The task (and its first test) as a user turn, the code as the assistant's, the asserts as ``tests``."""
    if not isinstance(row, Mapping):
        raise DataError(location, None, "an object with named columns", row)
    text = _string(row, "text", location)
    code = _lines(_string(row, "code", location)).strip("\n")
    asserts = row.get("test_list")
    if not (isinstance(asserts, list) and asserts and all(isinstance(t, str) and t.strip() for t in asserts)):
        raise DataError(location, "test_list", "a non-empty list of assert statements (strings)", asserts)
    setup = row.get("test_setup_code")
    if setup is not None and not isinstance(setup, str):
        raise DataError(location, "test_setup_code", "string or null", setup)
    setup = _lines(setup or "").strip("\n")
    # each test runs after the program, in a copy of its namespace: the setup may use what the code defines
    tests = [f"{setup}\n{_lines(t).strip()}" if setup.strip() else _lines(t).strip() for t in asserts]
    out = {
        "prompt": [{"role": "user", "content": mbpp_prompt(text, asserts[0])}],
        "completion": [{"role": "assistant", "content": code}],
        "tests": tests,
    }
    return _rest(row, ("text", "code", "test_list", "test_setup_code"), out)
