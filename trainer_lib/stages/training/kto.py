"""KTO (Ethayarajh et al. 2024), as ``trl kto`` runs it: the preference loop of :mod:`.dpo` with
``loss=kto`` on unpaired rows (``prompt``, ``completion``, ``label``).

    posttrain kto model.path=SFT data.path=UNPAIRED output_dir=OUT

The same as ``posttrain dpo loss=kto``; this command exists so that TRL's KTO files run as they are.
Every other key and default is DPO's (docs/training.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer_lib.config import opt
from trainer_lib.stages.training.dpo import LOSSES, DPOConfig, run

__all__ = ["CONFIG", "KTOConfig", "run"]


@dataclass
class KTOConfig(DPOConfig):
    loss: str = opt("kto", "Preference loss: kto on unpaired rows; the paired losses as in posttrain dpo.", LOSSES)


CONFIG = KTOConfig
