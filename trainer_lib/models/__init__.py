"""Models: loading from a hub id, a directory or a URL, LoRA, heads, attention, reference models, saving.

* :mod:`~trainer_lib.models.load`: tokenizers and causal LMs (``model.path`` at ``model.revision``), LoRA.
* :mod:`~trainer_lib.models.gguf_convert`: a ``.gguf`` model location, converted once into a folder in the cache.
* :mod:`~trainer_lib.models.attention`: packed rows attended per sequence with sdpa.
* :mod:`~trainer_lib.models.heads`: reward models (a scalar head) and their stored mean/std.
* :mod:`~trainer_lib.models.dual_encoder`: a multimodal reward model, a CLIP-like dual encoder on image + text pairs.
* :mod:`~trainer_lib.models.reference`: reference log-probs for preference training (model, adapters off,
  precomputed).
* :mod:`~trainer_lib.models.multi_adapter`: one frozen base shared by the RL roles as LoRA adapters.
* :mod:`~trainer_lib.models.save`: the final Hugging Face directory, a tensor at a time (ZeRO-3 included).

Nothing is imported here, so importing the package stays cheap.
"""
