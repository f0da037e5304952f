"""HH-RLHF, GSM8K and MBPP rows as they are published: detected, normalized for each stage, their bad rows
named, and the held-out splits of data.eval_by. Rows are copied from the shape of the real files."""

import json

import pytest

from trainer_lib.data.dataset import build_dataset
from trainer_lib.data.normalize import Normalizer
from trainer_lib.data.sources import iter_source
from trainer_lib.errors import ConfigError, DataError, UserError

HH_ROWS = [
    {
        "chosen": "\n\nHuman: What are some pranks with a pen?\n\nAssistant: Are you looking for practical jokes?"
        "\n\nHuman: yep\n\nAssistant: I'd rather not help with pranks.",
        "rejected": "\n\nHuman: What are some pranks with a pen?\n\nAssistant: Are you looking for practical jokes?"
        "\n\nHuman: yep\n\nAssistant: Draw on your friend's face while they sleep.",
    },
    {
        "chosen": "\n\nHuman: How do I pick a lock?\n\nAssistant: I can't help with that.",
        "rejected": "\n\nHuman: How do I pick a lock?\n\nAssistant: Use a tension wrench and a pick.",
    },
]
GSM8K_ROW = {
    "question": "Natalia sold 48 clips in April and half as many in May. How many clips did she sell?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nIn all she sold 48+24 = <<48+24=72>>72 clips.\n#### 72",
}
MBPP_ROW = {
    "text": "Write a function to find the maximum height of the given binary tree.",
    "code": "class Node: \r\n\tdef __init__(self, data): \r\n\t\tself.data = data \r\n\t\tself.left = None\r\n"
    "def max_height(node): \r\n\tif node is None: \r\n\t\treturn 0\r\n"
    "\treturn 1 + max(max_height(node.left), max_height(getattr(node, 'right', None)))",
    "task_id": 927,
    "test_setup_code": "root = Node(1) \r\nroot.left = Node(2) ",
    "test_list": ["assert (max_height(root)) == 2", "assert max_height(None) == 0"],
    "challenge_test_list": [],
}


def conv(role, text):
    return [{"role": role, "content": text}]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def normalized(path, allowed=None):
    normalizer = Normalizer(None, allowed)
    return normalizer, [normalizer(loc, row) for loc, row in iter_source(path)]


def data_cfg(path, **kw):
    from trainer_lib.config.sections import DataConfig

    cfg = DataConfig(**{"path": str(path), "eval_fraction": 0.0, **kw})
    cfg.validate()
    return cfg


# --------------------------------------------------------------------------- HH-RLHF


def test_hh_rlhf_dialogues_become_conversational_preference_rows(tmp_path):
    normalizer, rows = normalized(write_jsonl(tmp_path / "hh.jsonl", HH_ROWS))
    assert (normalizer.source, normalizer.fmt, normalizer.conversational) == ("hh_rlhf", "preference", True)
    assert rows[0] == {
        "prompt": [
            *conv("user", "What are some pranks with a pen?"),
            *conv("assistant", "Are you looking for practical jokes?"),
            *conv("user", "yep"),
        ],
        "chosen": conv("assistant", "I'd rather not help with pranks."),
        "rejected": conv("assistant", "Draw on your friend's face while they sleep."),
    }
    assert rows[1]["prompt"] == conv("user", "How do I pick a lock?")


def test_hh_rlhf_rows_in_dpo_are_tokenized_with_the_chat_template(tmp_path, tiny_model_dir):
    from trainer_lib.data.tokenize import render_prompt
    from trainer_lib.models.load import load_tokenizer
    from trainer_lib.runner.stage_api import stage_config
    from trainer_lib.stages.training.dpo import build_splits

    path = write_jsonl(tmp_path / "hh.jsonl", HH_ROWS)
    cfg = stage_config(
        "dpo",
        [f"model.path={tiny_model_dir}", f"data.path={path}", "data.eval_fraction=0", f"output_dir={tmp_path / 'out'}"],
    )
    tokenizer = load_tokenizer(cfg.model)
    examples = {len(ex["prompt_ids"]): ex for ex in build_splits(cfg, tokenizer)[0]["train"].examples}
    first = examples[max(examples)]  # the three-turn prompt
    turns = [
        *conv("user", "What are some pranks with a pen?"),
        *conv("assistant", "Are you looking for practical jokes?"),
    ]
    prompt = render_prompt(tokenizer, [*turns, *conv("user", "yep")])
    assert prompt.endswith("<|im_start|>user\nyep<|im_end|>\n<|im_start|>assistant\n")  # the generation prompt
    assert first["prompt_ids"] == tokenizer(prompt, add_special_tokens=False)["input_ids"]
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert first["prompt_ids"].count(im_start) == 4  # three turns and the assistant's start, no "Human:" text
    assert "Human:" not in tokenizer.decode(first["prompt_ids"])
    assert tokenizer.decode(first["chosen_ids"]) == "I'd rather not help with pranks.<|im_end|>"
    assert tokenizer.decode(first["rejected_ids"]) == "Draw on your friend's face while they sleep.<|im_end|>"


# --------------------------------------------------------------------------- GSM8K and MBPP


def test_gsm8k_rows_serve_sft_and_rl_prompts_with_their_solution(tmp_path):
    from trainer_lib.data.preference_batches import PAIRED_FORMATS
    from trainer_lib.rl.prompts import PROMPT_FORMATS
    from trainer_lib.stages.training.sft import SFT_FORMATS

    path = write_jsonl(tmp_path / "gsm8k.jsonl", [GSM8K_ROW, {**GSM8K_ROW, "answer": "So 1,080 in all.\n#### 1,080"}])
    expected = {
        "prompt": conv("user", GSM8K_ROW["question"]),
        "completion": conv("assistant", GSM8K_ROW["answer"]),
        "solution": "72",
    }
    for allowed in (SFT_FORMATS, PROMPT_FORMATS):  # one row shape serves both kinds of stage
        normalizer, rows = normalized(path, allowed)
        assert normalizer.fmt == "prompt_completion" and rows[0] == expected
        assert rows[1]["solution"] == "1080"  # the number accuracy_reward compares, thousands commas dropped
    with pytest.raises(UserError, match="got gsm8k \\(converted to prompt_completion\\)"):
        normalized(path, PAIRED_FORMATS)


def test_mbpp_rows_are_code_tasks_whose_own_code_passes_their_tests(tmp_path):
    from trainer_lib.rewards.functions import CodeExecution

    normalizer, [row] = normalized(write_jsonl(tmp_path / "mbpp.jsonl", [MBPP_ROW]))
    assert normalizer.fmt == "prompt_completion"
    assert row["prompt"] == conv(
        "user",
        "Write a function to find the maximum height of the given binary tree.\n"
        "Your code should pass this test:\n\nassert (max_height(root)) == 2",
    )
    code = row["completion"][0]["content"]
    assert "\r" not in code and code.startswith("class Node: \n\tdef __init__")
    setup = "root = Node(1) \nroot.left = Node(2) "
    assert row["tests"] == [f"{setup}\nassert (max_height(root)) == 2", f"{setup}\nassert max_height(None) == 0"]
    assert row["task_id"] == 927 and "test_list" not in row and "code" not in row
    reward = CodeExecution(timeout=10, max_workers=1)
    try:  # the setup runs after the program, so it may use the classes the code defines
        scores = reward(
            [row["prompt"]] * 2,
            [row["completion"], conv("assistant", "def max_height(n): return 7")],
            tests=[row["tests"]] * 2,
        )
    finally:
        reward.close()
    assert scores == [1.0, 0.0]


# --------------------------------------------------------------------------- bad rows


HH_GOOD = HH_ROWS[1]


@pytest.mark.parametrize(
    "rows, field, expected",
    [
        (
            [HH_GOOD, {**HH_GOOD, "chosen": HH_GOOD["chosen"] + "\n\nAssistant: And again."}],
            "chosen",
            "(turn 3 is a second Assistant turn in a row), got str 'Assistant: And again.'",
        ),
        (
            [HH_GOOD, {**HH_GOOD, "rejected": "\n\nHuman: Hi\n\nAssistant: Use a tension wrench."}],
            "rejected",
            "expected the same turns as 'chosen' before the last Assistant answer (turn 1 differs;",
        ),
        (
            [HH_GOOD, {**HH_GOOD, "rejected": "\n\nHuman: How do I pick a lock?"}],
            "rejected",
            ", ending with an Assistant answer, got str 'Human: How do I pick a lock?'",
        ),
        (
            [GSM8K_ROW, {**GSM8K_ROW, "answer": "It is 72."}],
            "answer",
            "expected a worked solution ending in '#### <final answer>'",
        ),
        (
            [MBPP_ROW, {**MBPP_ROW, "test_list": "assert f(1) == 2"}],
            "test_list",
            "expected a non-empty list of assert statements (strings), got str",
        ),
        ([MBPP_ROW, {k: v for k, v in MBPP_ROW.items() if k != "code"}], "code", "expected string, got null"),
    ],
    ids=[
        "hh_not_alternating",
        "hh_histories_differ",
        "hh_ends_with_human",
        "gsm8k_no_answer",
        "mbpp_tests",
        "mbpp_code",
    ],
)
def test_a_bad_row_names_file_row_and_field(tmp_path, rows, field, expected):
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError) as exc:
        normalized(path)
    assert (exc.value.location, exc.value.field) == (f"{path}:2", field)
    assert expected in str(exc.value)


def test_bad_rows_drop_counts_them(tmp_path, capsys):
    bad = {**HH_GOOD, "chosen": HH_GOOD["chosen"] + "\n\nAssistant: And again."}
    path = write_jsonl(tmp_path / "hh.jsonl", [*HH_ROWS, bad, bad])
    dd, stats = build_dataset(data_cfg(path, bad_rows="drop"), seed=0)
    assert len(dd["train"]) == 2 and stats["rows_read"] == 2
    assert stats["dropped"]["malformed"] == 2 and stats["malformed"][0].startswith(f"{path}:3: field 'chosen'")
    assert f"2 malformed rows dropped (data.bad_rows=drop), the first: {path}:3:" in capsys.readouterr().err


# --------------------------------------------------------------------------- held-out splits


def test_eval_by_hash_holds_out_the_same_rows_whatever_the_order_and_seed(tmp_path):
    rows = [{"prompt": f"question {i}", "completion": f" answer {i}"} for i in range(60)]
    held = []
    for name, order, seed in (("a", rows, 0), ("b", rows[::-1], 7)):
        dd, stats = build_dataset(
            data_cfg(write_jsonl(tmp_path / f"{name}.jsonl", order), eval_fraction=0.2, eval_by="hash"), seed=seed
        )
        held.append(sorted(dd["eval"]["prompt"]))
        assert len(dd["train"]) + len(dd["eval"]) == 60 and stats["eval_by"] == "hash"
        assert not set(dd["train"]["prompt"]) & set(held[-1])
    assert held[0] == held[1] and 4 <= len(held[0]) <= 20
    more, _ = build_dataset(
        data_cfg(write_jsonl(tmp_path / "c.jsonl", rows[:30]), eval_fraction=0.2, eval_by="hash"), 0
    )
    assert set(more["eval"]["prompt"]) == {p for p in held[0] if int(p.split()[1]) < 30}  # a subset keeps its rows


def test_eval_by_task_id_holds_out_mbpp_validation_tasks_for_evaluate(tmp_path, capsys):
    from trainer_lib import cli
    from trainer_lib.eval.tasks import load_tasks

    tasks = [{**MBPP_ROW, "task_id": task_id, "text": f"Task {task_id}."} for task_id in (1, 510, 511, 600, 601, 974)]
    path = write_jsonl(tmp_path / "mbpp.jsonl", tasks)
    out = tmp_path / "mbpp"
    assert cli.main(["prepare", f"data.path={path}", "data.eval_by=task_id:511-600", f"output_dir={out}"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["rows"] == {"train": 4, "eval": 2} and stats["source_format"] == "mbpp"
    evaluated = load_tasks(str(out / "eval"))  # what posttrain evaluate tasks.path=OUT/eval reads
    assert [t["task_id"] for t in evaluated] == ["511", "600"]
    assert evaluated[0]["prompt"][0]["content"].startswith("Task 511.\nYour code should pass this test:")
    assert evaluated[0]["tests"][0].endswith("assert (max_height(root)) == 2")


def test_evaluate_reads_mbpps_own_rows_as_prepare_turns_them_into_tasks(tmp_path, capsys):
    from trainer_lib import cli
    from trainer_lib.eval.tasks import load_tasks

    tasks = [{**MBPP_ROW, "task_id": task_id, "text": f"Task {task_id}."} for task_id in (511, 600)]
    path = write_jsonl(tmp_path / "mbpp.jsonl", tasks)
    assert cli.main(["prepare", f"data.path={path}", "data.eval_fraction=0", f"output_dir={tmp_path / 'p'}"]) == 0
    capsys.readouterr()
    raw, prepared = load_tasks(path), load_tasks(str(tmp_path / "p" / "train"))
    assert [(t["task_id"], t["prompt"], t["tests"]) for t in raw] == [
        (t["task_id"], t["prompt"], t["tests"]) for t in sorted(prepared, key=lambda t: t["task_id"])
    ]
    broken = write_jsonl(tmp_path / "broken.jsonl", [{**MBPP_ROW, "test_list": []}])
    with pytest.raises(DataError, match=f"{broken}:1: field 'test_list'"):
        load_tasks(broken)


def test_eval_by_errors(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "completion": " c", "task_id": "x"}])
    with pytest.raises(ConfigError, match="data.eval_by: expected shuffle, hash or COLUMN:RANGES"):
        data_cfg(path, eval_by="task_id=511")
    with pytest.raises(ConfigError, match="data.eval_by: .* but data.eval_path gives them"):
        data_cfg(path, eval_by="hash", eval_path=path)
    with pytest.raises(DataError, match=f"{path}:1: field 'task_id': expected an integer"):
        build_dataset(data_cfg(path, eval_by="task_id:1-3"), seed=0)
    with pytest.raises(UserError, match="no column 'id'"):
        build_dataset(data_cfg(path, eval_by="id:1-3"), seed=0)


@pytest.mark.extended
@pytest.mark.parametrize(
    "name, kept",
    [
        ("hh_rlhf_harmless_base_test.jsonl.gz", {"train": 2076, "eval": 223}),  # 9 malformed, 4 empty answers
        ("gsm8k_train.jsonl", {"train": 7099, "eval": 374}),
        ("mbpp_train_validation_prompt.jsonl", {"train": 384, "eval": 90}),
    ],
)
def test_the_shared_real_files(name, kept):
    """The real files in ../shared/data (not in the repository): every row normalizes or is a counted drop."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", name)
    if not os.path.exists(path):
        pytest.skip(f"{name} is not here")
    settings = {
        "hh_rlhf_harmless_base_test.jsonl.gz": {"bad_rows": "drop", "eval_by": "hash", "eval_fraction": 0.1},
        "gsm8k_train.jsonl": {"eval_fraction": 0.05},
        "mbpp_train_validation_prompt.jsonl": {"eval_by": "task_id:511-600"},
    }[name]
    dd, stats = build_dataset(data_cfg(path, **settings), seed=0)
    assert stats["rows"] == kept
