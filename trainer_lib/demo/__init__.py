"""The embedded default: bundled demo datasets and a tiny model, so the whole pipeline runs without downloads.

* :mod:`~trainer_lib.demo.demo_spec`: :class:`DemoSpec`, the sizes and shares of the demo dataset.
* :mod:`~trainer_lib.demo.generator`: ``generate_demo_data(out_dir, spec)``, the dataset writer.
* :mod:`~trainer_lib.demo.code_families`: the table of code-task families.
* :mod:`~trainer_lib.demo.code_tasks`: tasks built from it and verified, their split, and the SFT teacher's mistakes.
* :mod:`~trainer_lib.demo.safety_prompts`: harmful and benign prompts, as pairs, SFT rows and held-out prompts.
* :mod:`~trainer_lib.demo.demo_data`: the ``posttrain demo-data`` stage.
* :mod:`~trainer_lib.demo.tiny_model`: a BPE tokenizer and a small random Llama, and ``posttrain tiny-model``.
* :mod:`~trainer_lib.demo.agent`: ``make demo-agent``, SFT then GRPO with the calculator on big-number questions.
* :mod:`~trainer_lib.demo.distill_demo`: on-policy distillation against SFT on a teacher's samples, on the demo.
* :mod:`~trainer_lib.demo.online_dpo_demo`: online DPO against offline DPO on the demo's safety prompts.
* :mod:`~trainer_lib.demo.stage_runs`: what those three drivers share: a ``posttrain`` stage in a subprocess.
* (and the multimodal demo's ``multimodal*.py``, docs/multimodal.md)
"""
