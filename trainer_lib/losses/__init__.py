"""Loss functions: pure math over tensors, each citing its paper equation (imports only torch).

Importing this package imports torch (the losses are torch functions) but nothing heavier.
"""

from trainer_lib.losses.preference import (dpo_sigmoid_loss, hinge_loss, ipo_loss, kto_loss,
                                           kto_reference_point, pairwise_reward_loss,
                                           reward_centering_penalty, robust_dpo_loss, rpo_nll_term, simpo_loss)

__all__ = ["dpo_sigmoid_loss", "hinge_loss", "ipo_loss", "kto_loss", "kto_reference_point",
           "pairwise_reward_loss", "reward_centering_penalty", "robust_dpo_loss", "rpo_nll_term", "simpo_loss"]
from trainer_lib.losses.rl import (KLController, clipped_surrogate, constant_normalized_sum,  # noqa: E402
                                   explained_variance, gae_advantages, grpo_advantages, kl_penalty,
                                   masked_mean, masked_whiten, ppo_policy_loss, ppo_value_loss,
                                   rloo_advantages, sequence_mean, whiten)

__all__ += ["KLController", "clipped_surrogate", "constant_normalized_sum", "explained_variance",
            "gae_advantages", "grpo_advantages", "kl_penalty", "masked_mean", "masked_whiten",
            "ppo_policy_loss", "ppo_value_loss", "rloo_advantages", "sequence_mean", "whiten"]
