"""The model card of a release: ``README.md`` in the Hugging Face format, written from the lineage and
the evaluation.

The YAML header holds what the hub and ``huggingface_hub.ModelCard`` read: ``base_model`` and
``datasets`` (hub ids, where the lineage knows them), ``license`` (the base model's, when its card
says), ``tags`` (posttrain and the stages), and the candidate's figures as ``model-index`` results.
The text below it says how the model was made (stages and their main settings, sources and
fingerprints, commit, image, run) and how it was judged (metrics against the baseline, every gate
rule with its figures).
"""

from __future__ import annotations

#: The settings of a stage the card shows (every key is in release.json's lineage).
SHOWN_KEYS = ("max_steps", "lr", "batch_size", "loss", "beta", "lora.r", "rollout.n", "advantage", "seed")
EVAL_DATASET = {"dataset_type": "posttrain-eval", "dataset_name": "posttrain held-out evaluation"}


def hub_datasets(lineage: dict) -> list[str]:
    """Hub ids of the data sources (given as hub ids or Hugging Face cache snapshots)."""
    from trainer_lib.release.lineage import hub_id_of

    found = [hub_id_of(item["location"]) for item in (lineage.get("data") or {}).values()]
    return list(dict.fromkeys(hub_id for hub_id in found if hub_id))


def card_data(lineage: dict, evaluation: dict, model_name: str):
    """The card's YAML header as ``huggingface_hub.ModelCardData``."""
    from huggingface_hub import EvalResult, ModelCardData

    base = lineage.get("base_model") or {}
    figures = evaluation.get("models", {}).get(evaluation.get("candidate"), {})
    results = [
        EvalResult(task_type="text-generation", metric_type=name, metric_value=value, metric_name=name, **EVAL_DATASET)
        for name, value in figures.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    ]
    stages = [s.get("stage") for s in lineage.get("stages", []) if s.get("stage")]
    return ModelCardData(
        model_name=model_name,
        base_model=base.get("hub_id"),
        datasets=hub_datasets(lineage) or None,
        license=base.get("license"),
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["posttrain", *dict.fromkeys(stages)],
        eval_results=results or None,
    )


def render(lineage: dict, evaluation: dict, gate: dict, model_name: str, released_at: str) -> str:
    """The whole ``README.md``: YAML header, then the text."""
    data = card_data(lineage, evaluation, model_name)
    body = [
        f"# {model_name}",
        "",
        _summary(lineage, evaluation, released_at),
        "",
        *_training(lineage),
        *_evaluation(evaluation, gate),
        *_provenance(lineage),
    ]
    return f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body) + "\n"


def _summary(lineage: dict, evaluation: dict, released_at: str) -> str:
    base = lineage.get("base_model") or {}
    built = lineage.get("posttrain") or {}
    stages = " -> ".join(s.get("stage") or "?" for s in lineage.get("stages", [])) or "unknown stages"
    start = base.get("hub_id") or base.get("location") or "an unrecorded base model"
    commit = built.get("commit") or "unknown commit"
    return (
        f"Post-trained from `{start}` by {stages} with posttrain {built.get('version') or '?'} ({commit}"
        f"{', uncommitted changes' if built.get('dirty') else ''}). Released {released_at} after its evaluation "
        f"gate passed: candidate `{evaluation.get('candidate')}` against baseline `{evaluation.get('baseline')}`."
    )


def _training(lineage: dict) -> list[str]:
    lines = ["## Training", "", "| stage | settings | data (fingerprint) |", "|---|---|---|"]
    for record in lineage.get("stages", []):
        config = record.get("config") or {}
        shown = [k for k in SHOWN_KEYS if config.get(k) not in (None, "", []) and not (k == "lora.r" and not config[k])]
        settings = ", ".join(f"{k}={config[k]}" for k in shown)
        data = "; ".join(
            f"`{item['location']}` ({item['fingerprint'][:12]})"
            for key, items in (record.get("inputs") or {}).items()
            if key.startswith("data.")
            for item in items
        )
        lines.append(f"| {record.get('stage') or '?'} | {settings or 'not recorded'} | {data or '-'} |")
    return [*lines, "", "Every stage's full effective config is in `release.json` (`lineage.stages`).", ""]


def _evaluation(evaluation: dict, gate: dict) -> list[str]:
    models = evaluation.get("models", {})
    labels = [x for x in (evaluation.get("candidate"), evaluation.get("baseline")) if x in models]
    names = list(dict.fromkeys(name for label in labels for name in models[label]))
    lines = ["## Evaluation", "", "| metric | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_number(models[label].get(name)) for label in labels) + " |")
    lines += ["", "Gate rules:", ""]
    for rule in [*gate.get("rules", []), *gate.get("served", {}).get("rules", [])]:
        verdict = "passed" if rule.get("passed") else "FAILED"
        figures = f"value {_number(rule.get('value'))}, threshold {_number(rule.get('threshold'))}"
        lines.append(f"- `{rule.get('rule')}`: {verdict} ({figures})")
    return [*lines, ""]


def _provenance(lineage: dict) -> list[str]:
    built, image, run = lineage.get("posttrain") or {}, lineage.get("image") or {}, lineage.get("kfp") or {}
    base = lineage.get("base_model") or {}
    lines = [
        "## Lineage",
        "",
        f"- base model: `{base.get('location')}` revision {base.get('revision') or 'unknown'}, "
        f"fingerprint {base.get('fingerprint') or '-'}",
    ]
    for name, item in (lineage.get("data") or {}).items():
        lines.append(f"- {name}: `{item['location']}` fingerprint {item['fingerprint']}")
    lines += [
        f"- posttrain {built.get('version')}, commit {built.get('commit') or 'unknown'} ({built.get('from')})",
        f"- image: {image.get('reference') or '-'}, digest {image.get('digest') or 'unknown'}",
    ]
    if run:
        lines.append("- KFP run: " + ", ".join(f"{k} {v}" for k, v in run.items()))
    return lines


def _number(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
