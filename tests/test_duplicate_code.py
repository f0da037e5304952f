"""make lint's count of repeated code (.ci/duplicate_code.py): a renamed copy counts, other fields do not."""

import importlib.util
import os
import textwrap

from tests.conftest import REPO

ORIGINAL = '''
def score(rows, completions, sandbox, timeout=3.0):
    """Run each completion against its row's tests."""
    if len(rows) != len(completions):
        raise ValueError(f"{len(rows)} rows but {len(completions)} completions")
    results = sandbox.run_many([(c, r["tests"]) for r, c in zip(rows, completions)], timeout=timeout)
    per_row = []
    for row, result in zip(rows, results):
        per_row.append({"task_id": row["task_id"], "passed": result.passed, "status": result.status})
    metrics = {"pass_rate": sum(r["passed"] for r in per_row) / len(per_row)}
    return metrics, per_row
'''


def load_check(monkeypatch, root):
    spec = importlib.util.spec_from_file_location("duplicate_code", os.path.join(REPO, ".ci", "duplicate_code.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "ROOT", str(root))
    return module


def write(root, path: str, text: str) -> None:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    (root / path).write_text(textwrap.dedent(text))


def test_a_copy_with_its_names_changed_is_one_repeated_block(tmp_path, monkeypatch):
    renamed = ORIGINAL.replace("score", "grade").replace("per_row", "rows_out").replace("metrics", "figures")
    write(tmp_path, "trainer_lib/eval/a.py", ORIGINAL)
    write(tmp_path, "trainer_lib/eval/b.py", "\nimport os\n" + renamed)
    write(tmp_path, "pipelines/c.py", ORIGINAL + "\n\n" + renamed.replace("grade", "mark"))  # within one file too
    blocks = load_check(monkeypatch, tmp_path).repeated_blocks()
    assert len(blocks) == 2, blocks
    assert any("trainer_lib/eval/a.py:2-" in b and "trainer_lib/eval/b.py:4-" in b for b in blocks), blocks


def test_fields_of_other_names_and_texts_are_not_a_copy(tmp_path, monkeypatch):
    fields = "\n".join(f'    {name}: int = opt({i}, "The {name} of it.")' for i, name in enumerate("abcdefgh"))
    other = "\n".join(f'    {name}: int = opt({i + 9}, "How many {name}.")' for i, name in enumerate("pqrstuvw"))
    write(tmp_path, "trainer_lib/config/a.py", f"@dataclass\nclass A:\n{fields}\n")
    write(tmp_path, "components/b.py", f"@dataclass\nclass B:\n{other}\n")
    assert load_check(monkeypatch, tmp_path).repeated_blocks() == []
