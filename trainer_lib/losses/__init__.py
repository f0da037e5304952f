"""Loss functions: pure math over tensors, each citing its paper equation (imports only torch).

* :mod:`~trainer_lib.losses.preference`: reward-model and DPO-family losses (DPO, cDPO, IPO, hinge,
  robust DPO, SimPO, KTO, RPO, beta-DPO).
* :mod:`~trainer_lib.losses.advantages`: masked statistics, advantage estimators (GAE, GRPO, RLOO,
  REINFORCE++) and DAPO's overlong reward shaping.
* :mod:`~trainer_lib.losses.policy_gradient`: KL estimators and control, clipped policy and value
  losses (token-level with DAPO's clip-higher, GSPO's sequence-level), A2C's unclipped policy
  gradient, the entropy bonus, token-loss averaging, truncated importance weights for a rollout engine.
* :mod:`~trainer_lib.losses.distillation`: the student against a frozen teacher: per-token reverse KL
  (exact from full-vocabulary log-probs, or estimated from sampled tokens) and GKD's generalized JSD.
* :mod:`~trainer_lib.losses.process_reward`: a process reward model's step loss, and the min / last / mean
  aggregations of its step scores into one reward.

Every public function is importable from the package itself. Importing it imports torch, nothing heavier.
"""

from trainer_lib.losses.advantages import (
    explained_variance,
    gae_advantages,
    grpo_advantages,
    kl_penalized_returns,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    overlong_penalty,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)
from trainer_lib.losses.distillation import (
    chunked_generalized_jsd,
    generalized_jsd,
    generalized_jsd_loss,
    reverse_kl,
    reverse_kl_loss,
    sampled_reverse_kl,
    sampled_reverse_kl_loss,
)
from trainer_lib.losses.policy_gradient import (
    KLController,
    clipped_surrogate,
    constant_normalized_sum,
    entropy_bonus,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalty,
    policy_gradient_loss,
    ppo_policy_loss,
    ppo_value_loss,
    sequence_clipped_surrogate,
    sequence_mean,
    token_mean,
    truncated_importance_weights,
)
from trainer_lib.losses.preference import (
    beta_dpo_beta,
    beta_dpo_loss,
    dpo_sigmoid_loss,
    hinge_loss,
    ipo_loss,
    kto_loss,
    kto_reference_point,
    margin_filter_mask,
    margin_filter_weights,
    pairwise_reward_loss,
    reward_centering_penalty,
    robust_dpo_loss,
    rpo_nll_term,
    simpo_loss,
)
from trainer_lib.losses.process_reward import prm_step_loss, step_last, step_mean, step_min

__all__ = [
    "KLController",
    "beta_dpo_beta",
    "beta_dpo_loss",
    "clipped_surrogate",
    "constant_normalized_sum",
    "dpo_sigmoid_loss",
    "entropy_bonus",
    "explained_variance",
    "gae_advantages",
    "chunked_generalized_jsd",
    "generalized_jsd",
    "generalized_jsd_loss",
    "grpo_advantages",
    "hinge_loss",
    "ipo_loss",
    "kl_k1",
    "kl_k2",
    "kl_k3",
    "kl_penalized_returns",
    "kl_penalty",
    "kto_loss",
    "kto_reference_point",
    "margin_filter_mask",
    "margin_filter_weights",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "overlong_penalty",
    "pairwise_reward_loss",
    "policy_gradient_loss",
    "ppo_policy_loss",
    "ppo_value_loss",
    "prm_step_loss",
    "reinforce_pp_advantages",
    "reverse_kl",
    "reverse_kl_loss",
    "reward_centering_penalty",
    "rloo_advantages",
    "robust_dpo_loss",
    "rpo_nll_term",
    "sampled_reverse_kl",
    "sampled_reverse_kl_loss",
    "sequence_clipped_surrogate",
    "sequence_mean",
    "simpo_loss",
    "step_last",
    "step_mean",
    "step_min",
    "token_mean",
    "truncated_importance_weights",
    "whiten",
]
