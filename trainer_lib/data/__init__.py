"""Datasets: read any source, normalize to TRL's formats, validate every row, tokenize, cache.

* :mod:`~trainer_lib.data.sources`: raw rows from files, ``datasets`` directories, hub ids and URLs, each
  row with its location (``file:line``) for error messages.
* :mod:`~trainer_lib.data.formats`: the formats TRL users have (text, prompt/completion, messages,
  preference, unpaired), detected and normalized; :mod:`~trainer_lib.data.llamafactory`: alpaca and sharegpt;
  :mod:`~trainer_lib.data.public_datasets`: HH-RLHF, GSM8K and MBPP rows as published.
* :mod:`~trainer_lib.data.normalize`: rows one at a time, normalized, validated and filtered;
  :mod:`~trainer_lib.data.dataset`: train/eval splits built from them (:mod:`~trainer_lib.data.holdout`: which
  rows are held out); :mod:`~trainer_lib.data.arrow_rows`: normalized rows streamed to Arrow files.
* :mod:`~trainer_lib.data.tokenize`, :mod:`~trainer_lib.data.tokenized`, :mod:`~trainer_lib.data.cache`:
  tokenization with prompt masks, packing and collation, built once and cached by content fingerprint.
* :mod:`~trainer_lib.data.preference_batches`: preference pairs and unpaired rows for the reward and DPO stages.
* :mod:`~trainer_lib.data.chat_templates`: ``model.chat_template`` (built-in names, Jinja text or a file),
  which renders chat rows to text.
* :mod:`~trainer_lib.data.images`: the ``images`` column: references checked, hashed and loaded lazily.

Nothing is imported here, so importing the package stays cheap.
"""
