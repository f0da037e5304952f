"""Policy-gradient objectives for PPO, A2C, GRPO, RLOO, DAPO and GSPO: KL estimators and control, clipped
(token- or sequence-level) and unclipped policy losses, value losses, the entropy bonus, and how token
losses are averaged. Tensors in, tensors out.

Shapes as in :mod:`trainer_lib.losses.advantages`: ``(B, T)`` per-token tensors of right-padded
response tokens, ``mask`` 1 on response tokens. Nothing here imports more than torch.
"""

from __future__ import annotations

import torch

from trainer_lib.losses.advantages import masked_mean, masked_sum

# --------------------------------------------------------------------------- KL estimators
# Schulman, "Approximating KL divergence" (2020): with samples from pi and log-ratio
# log r = ref - logprobs, each is an estimator of KL(pi || ref).


def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``log pi - log ref``: unbiased, high variance, can be negative."""
    return logprobs - ref_logprobs


def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``0.5 * (log pi - log ref)^2``: biased, low variance, >= 0."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """``exp(ref - log pi) - (ref - log pi) - 1``: unbiased and >= 0 (GRPO eq. 4)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str) -> torch.Tensor:
    """Elementwise KL estimate of ``kind`` (``k1``, ``k2`` or ``k3``)."""
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"kl_penalty: kind must be one of {sorted(KL_ESTIMATORS)}, got {kind!r}")
    return KL_ESTIMATORS[kind](logprobs, ref_logprobs)


class KLController:
    """KL coefficient: fixed, or adaptive towards ``target`` (Ziegler et al. 2019, sec. 2.2).

        e      = clip(KL / target - 1, -0.2, 0.2)
        beta  <- beta * (1 + e * n_steps / horizon)

    ``target=None`` keeps the coefficient fixed. ``state_dict`` / ``load_state_dict`` carry the
    current value across a resume.
    """

    def __init__(self, coef: float, target: float | None = None, horizon: int = 10000):
        self.value = float(coef)
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> float:
        if self.target:
            error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
            self.value *= 1.0 + error * n_steps / self.horizon
        return self.value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = float(state["value"])


# --------------------------------------------------------------------------- PPO losses


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss (Schulman et al. 2017, PPO eq. 7), negated to minimize:

        ratio = exp(log pi - log pi_old)
        loss  = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)

    ``clip_range`` is eps_low; ``clip_high`` is eps_high, the same as ``clip_range`` when None (PPO's
    symmetric clip). A larger eps_high is DAPO's clip-higher (Yu et al. 2025, eq. 10): a
    low-probability token with a positive advantage may grow further before it is clipped.
    ``advantages`` is ``(B, T)`` or ``(B, 1)`` (one per sequence, broadcast). Returns the loss
    and a 0/1 tensor marking tokens where the clipped term was chosen.
    """
    clip_high = clip_range if clip_high is None else clip_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).to(logprobs.dtype)


def sequence_clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's sequence-level clipped loss (Zheng et al. 2025, eq. 5 and 7), negated to minimize:

        s_i    = (pi(y_i | x) / pi_old(y_i | x)) ^ (1 / |y_i|)
               = exp(1/|y_i| sum_t (log pi_{i,t} - log pi_old_{i,t}))
        loss_i = -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)

    One ratio per completion (the geometric mean of its token ratios), clipped as a whole.
    ``advantages`` holds one value per sequence, ``(B,)`` or ``(B, 1)``. Returns ``loss_i``
    repeated over the sequence's positions ``(B, T)``, so that :func:`sequence_mean` of it is
    GSPO's ``1/G sum_i loss_i``, and the 0/1 clipped marker repeated the same way.
    """
    sequence_log_ratio = masked_mean(logprobs - old_logprobs, mask, dim=-1)
    loss, clipped = clipped_surrogate(
        sequence_log_ratio, torch.zeros_like(sequence_log_ratio), advantages.reshape(-1), clip_low, clip_high
    )
    return loss.unsqueeze(1).expand_as(logprobs), clipped.unsqueeze(1).expand_as(logprobs)


def ppo_policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict]:
    """Token-mean clipped surrogate, plus ``clip_fraction`` and ``approx_kl`` (old -> new, k2)."""
    per_token, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_range)
    with torch.no_grad():
        stats = {
            "clip_fraction": masked_mean(clipped, mask),
            "approx_kl": masked_mean(kl_k2(logprobs, old_logprobs), mask),
        }
    return masked_mean(per_token, mask), stats


def ppo_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict]:
    """Clipped value loss (PPO2 baselines; Ziegler et al. 2019):

        V_clip = V_old + clip(V - V_old, -eps, eps)
        loss   = 0.5 * mean(max((V - R)^2, (V_clip - R)^2))

    ``clip_range <= 0`` turns clipping off (plain squared error).
    """
    unclipped = (values - returns) ** 2
    if clip_range > 0:
        clipped_values = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
        clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        fraction = masked_mean((clipped > unclipped).to(values.dtype), mask)
    else:
        per_token, fraction = unclipped, torch.zeros((), dtype=values.dtype)
    return 0.5 * masked_mean(per_token, mask), {"value_clip_fraction": fraction.detach()}


# --------------------------------------------------------------------------- rollout / training mismatch


def truncated_importance_weights(
    train_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance sampling for a rollout engine that is not the trained model (Yao et al. 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", the TIS estimator):

        w_t = min(pi_train(y_t | x, y_<t) / pi_rollout(y_t | x, y_<t), C)

    ``train_logprobs``: the tokens' log-probs under the trained model before the update (pi_old);
    ``rollout_logprobs``: under the engine that sampled them (another precision, kernel or copy of the
    weights). Each token's policy loss is multiplied by ``w_t``, which corrects the gradient toward the one
    taken on pi_train's own samples; the cap ``C`` bounds its variance. The weights are constants (no
    gradient); padding positions get whatever their log-probs give, the caller's mask drops them.
    """
    return torch.exp(train_logprobs.detach() - rollout_logprobs.detach()).clamp(max=cap)


# --------------------------------------------------------------------------- A2C and the entropy bonus


def policy_gradient_loss(
    logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict]:
    """A2C's unclipped policy-gradient loss (Mnih et al. 2016, sec. 4 and Algorithm S3), token-mean:

        loss = -mean_t A_t * log pi(a_t | s_t)

    its gradient is ``-mean_t A_t * grad log pi(a_t | s_t)``, the advantage actor-critic update
    (``A_t`` are constants: GAE or n-step returns minus the critic's values). No ratio and no clip:
    it is only an unbiased gradient for the weights that sampled the actions, so it is taken once per
    rollout. Returns the loss and no statistics (an empty dict, as the other losses return theirs).
    """
    return -masked_mean(advantages.detach() * logprobs, mask), {}


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, coef: float) -> torch.Tensor:
    """The entropy regularization term added to the policy loss (Mnih et al. 2016, sec. 4; PPO eq. 9's
    ``c2 * S``), negated to minimize: ``-coef * mean_t H(pi(. | s_t))``. ``entropy`` must carry a
    gradient for the term to act; with ``coef = 0`` it is exactly 0."""
    return -coef * masked_mean(entropy, mask)


# --------------------------------------------------------------------------- aggregation
# How per-token losses become one number changes what a long answer weighs.


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO (Shao et al. 2024, eq. 3): ``1/G sum_i 1/|o_i| sum_t l_{i,t}``."""
    return masked_mean(per_token, mask, dim=-1).mean()


def constant_normalized_sum(per_token: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, eq. 3): ``1/G sum_i 1/L sum_t l_{i,t}`` with a constant ``L``
    (the generation budget), so no length bias from dividing by ``|o_i|``."""
    return masked_sum(per_token, mask) / (per_token.shape[0] * max_tokens)


def token_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DAPO's token-level loss (Yu et al. 2025, eq. 12): ``1/sum_i |o_i| sum_i sum_t l_{i,t}``, every
    token of the batch weighs the same, so a long answer counts in proportion to its length."""
    return masked_mean(per_token, mask)
