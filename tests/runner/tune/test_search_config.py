"""The checks made before any trial: each refusal is one line naming the key, exit 2."""

import pytest
import yaml

from tests.runner.tune.tune_helpers import search_file
from trainer_lib.cli import main


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"space": {"lrr": {"low": 1e-4, "high": 1e-3}}}, "space.lrr: the stage has no such key (did you mean 'lr'?)"),
        ({"space": {"lr": {"low": 1e-3, "high": 1e-4}}}, "space.lr: empty range, low 0.001 is not below high 0.0001"),
        ({"space": {"lora.r": {"type": "float", "low": 2, "high": 8}}}, "space.lora.r: the key takes an integer"),
        ({"space": {"loss": {"low": 1, "high": 3}}}, "space.loss: the key takes text; search it with choices"),
        ({"space": {"loss": {"choices": ["sigmoid", "nope"]}}}, "space.loss: 'nope' is refused by dpo"),
        ({"space": {"beta": {"low": 0.0, "high": 0.5}}}, "space.beta: 0.0 is refused by dpo: beta: expected"),
        ({"space": {"lr": {"low": 0, "high": 1e-3, "log": True}}}, "space.lr: a log range needs low > 0"),
        ({"space": {"lr": {"low": 1e-4, "high": 1e-3, "when": {"los": "ipo"}}}}, "space.lr.when.los: the stage has no"),
        (
            {"space": {"label_smoothing": {"low": 0.0, "high": 0.2, "when": {"loss": "ipo"}}}},
            "space.label_smoothing.when: never met with this base config",
        ),
        ({"space": {"data.eval_path": {"choices": ["a", "b"]}}}, "space.data.eval_path: it changes the held-out rows"),
        (
            {"objective": {"metric": "eval_loss", "direction": "minimize"}},
            "objective.metric: eval_loss of dpo changes scale with beta, which is searched",
        ),
        ({"objective": {"metric": "rewards/margins"}}, "rewards/margins of dpo changes scale with beta"),
        (
            {"evaluate": {"tasks.path": "tasks.jsonl"}, "objective": {"metric": "math_accuracy"}},
            "objective.metric: math_accuracy is not a metric of this evaluate run; it computes task_pass_rate",
        ),
        (
            {"evaluate": {"tasks.path": "t.jsonl", "humaneval.enabled": False}, "objective": {"metric": "eval_loss"}},
            "objective.metric: eval_loss is not a metric of this evaluate run",
        ),
        ({"evaluate": {"tasks.pth": "t.jsonl"}, "objective": {"metric": "task_pass_rate"}}, "evaluate: tasks.pth"),
        (
            {"evaluate": {"models": "x=/m", "tasks.path": "t"}, "objective": {"metric": "task_pass_rate"}},
            "evaluate.models: set by the search",
        ),
        (
            {"evaluate": {"tasks.path": "t"}, "objective": {"metric": "task_pass_rate"}, "pruner": {"metric": "loss"}},
            "pruner.metric: loss of dpo changes scale with beta, which is searched",
        ),
        ({"n_trials": 0}, "n_trials: expected a positive integer, got 0"),
        ({"stage": "evaluate"}, "stage: expected a training stage"),
        ({"spaces": {}}, "spaces: unknown key (did you mean 'space'?)"),
    ],
)
def test_a_bad_search_stops_before_any_trial_in_one_line(tmp_path, capsys, changes, expected):
    path = search_file(tmp_path, **changes)
    assert main(["tune", "--config", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    assert expected in err
    assert not (tmp_path / "search").exists(), "a trial or a study was started"


def test_a_conditional_categorical_and_int_space_is_accepted(tmp_path):
    from trainer_lib.runner.tune.search_config import load_search

    space = {
        "loss": {"choices": ["sigmoid", "ipo"]},
        "label_smoothing": {"low": 0.0, "high": 0.2, "when": {"loss": "sigmoid"}},
        "lora": {"r": {"low": 4, "high": 16, "step": 4}},
        "lr": {"low": "1e-5", "high": 1e-3, "log": True},  # YAML reads 1e-5 as text
    }
    search = load_search(search_file(tmp_path, space=space), ["n_trials=3"])
    params = {p.key: p for p in search.params}
    assert [p.key for p in search.params].index("loss") < [p.key for p in search.params].index("label_smoothing")
    assert params["lora.r"].kind == "int" and params["lr"].kind == "float" and params["lr"].low == 1e-5
    assert params["label_smoothing"].when == (("loss", ("sigmoid",)),)
    assert search.tune.n_trials == 3
    # eval_loss is fine when nothing it depends on is searched
    load_search(search_file(tmp_path, space={"lr": {"low": 1e-5, "high": 1e-3}}, objective={"metric": "eval_loss"}))


def test_per_trial_seeds_need_a_fixed_held_out_set(tmp_path, capsys):
    data = yaml.safe_load(open(search_file(tmp_path)))["overrides"]
    del data["data.eval_path"]
    path = search_file(tmp_path, overrides=data, trial_seed="per_trial")
    assert main(["tune", "--config", path]) == 2
    assert "trial_seed: per_trial draws other held-out rows" in capsys.readouterr().err


def test_an_rl_reward_cannot_rank_trials_that_search_its_sources():
    from trainer_lib.errors import ConfigError
    from trainer_lib.runner.tune.search_config import ObjectiveConfig, TuneConfig, check_objective

    tune = TuneConfig(stage="grpo", objective=ObjectiveConfig("rewards/code_execution"))
    with pytest.raises(ConfigError, match="rewards/code_execution of grpo changes scale with reward.weights"):
        check_objective(tune, None, ["reward.weights"])
    check_objective(tune, None, ["lr", "rollout.temperature"])


def test_help_lists_the_search_file_keys_and_posttrain_lists_tune(capsys):
    assert main(["tune", "--help"]) == 0
    text = capsys.readouterr().out
    assert "usage: posttrain tune --config tune.yaml" in text and "objective.metric" in text and "pruner.kind" in text
    assert main(["--help"]) == 0
    assert "  tune " in capsys.readouterr().out
    assert main(["tune"]) == 2  # no search file


def test_the_example_search_file_passes_the_checks():
    from tests.conftest import REPO
    from trainer_lib.runner.tune.search_config import load_search

    search = load_search(f"{REPO}/examples/tune/dpo-lr-beta.yaml")
    assert [p.key for p in search.params] == ["lr", "beta"] and search.params[0].log
    assert (search.tune.n_trials, search.tune.parallel, search.tune.objective.metric) == (8, 2, "logps/accuracy")
