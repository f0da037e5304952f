"""RL math for PPO, GRPO and RLOO: advantages, KL estimators, clipped losses. Tensors in, tensors out.

Shapes: ``(B, T)`` per-token tensors hold the response tokens of ``B`` sequences, right-padded;
``mask`` is 1 on response tokens (up to and including the eos) and 0 on padding. Group
methods take ``(B,)`` sequence rewards laid out as consecutive groups of ``group_size``
completions of the same prompt. Nothing here imports more than torch.
"""

from __future__ import annotations

import torch

# --------------------------------------------------------------------------- masked statistics


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    return (values * mask).sum() if dim is None else (values * mask).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over positions where ``mask`` is 1 (0 when the mask is empty)."""
    return masked_sum(values, mask, dim) / (mask.sum() if dim is None else mask.sum(dim)).clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over masked positions; Bessel-corrected like ``torch.var`` when ``unbiased``."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    count = mask.sum()
    if unbiased and count > 1:
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
                  eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / sqrt(var + eps)`` over masked positions; ``shift_mean=False`` keeps the mean
    (rescales only), as PPO implementations do for rewards."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    return whitened if shift_mean else whitened + mean


def whiten(values: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    return masked_whiten(values, torch.ones_like(values), shift_mean, eps)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``1 - Var[R - V] / Var[R]``: 1 for a perfect critic, 0 for a constant one, < 0 for worse."""
    return 1 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp(min=1e-8)


# --------------------------------------------------------------------------- advantages


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                   lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, eq. 11-16), ``(B, T)`` in and out.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                       (the critic's regression target)

    Values at and after the end of a response (``mask == 0``) count as 0: the episode ends
    with the last response token. Advantages and returns are 0 off the mask.
    """
    mask = mask.to(values.dtype)
    values = values * mask
    rewards = rewards * mask
    steps = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(steps)):
        next_value = values[..., t + 1] if t + 1 < steps else torch.zeros_like(running)
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        running = delta + gamma * lam * running
        advantages[..., t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True,
                    eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages, ``(B,)`` in and out.

    GRPO (Shao et al. 2024, DeepSeekMath sec. 4.1.2): ``A_i = (r_i - mean(r)) / (std(r) + eps)``
    over the ``group_size`` completions of a prompt (``std`` Bessel-corrected, as ``torch.std``).
    Dr. GRPO (Liu et al. 2025, eq. 3) drops the std scaling, which biases towards easy and
    hard prompts: ``scale=False`` gives ``A_i = r_i - mean(r)``.
    """
    groups = _groups(rewards, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if scale:
        std = groups.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centered[:, :1])
        centered = centered / (std + eps)
    return centered.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, eq. 6; Kool et al. 2019), ``(B,)`` in and out.

        A_i = r_i - 1/(k-1) * sum_{j != i} r_j
    """
    if group_size < 2:
        raise ValueError("rloo_advantages: needs group_size >= 2 (a baseline from the other samples)")
    groups = _groups(rewards, group_size)
    baseline = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    return (groups - baseline).reshape(-1)


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


def clipped_surrogate(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      clip_range: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss (Schulman et al. 2017, PPO eq. 7), negated to minimize:

        ratio = exp(log pi - log pi_old)
        loss  = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)

    ``advantages`` is ``(B, T)`` or ``(B, 1)`` (one per sequence, broadcast). Returns the loss
    and a 0/1 tensor marking tokens where the clipped term was chosen.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.maximum(unclipped, clipped), (clipped > unclipped).to(logprobs.dtype)


def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    mask: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, dict]:
    """Token-mean clipped surrogate, plus ``clip_fraction`` and ``approx_kl`` (old -> new, k2)."""
    per_token, clipped = clipped_surrogate(logprobs, old_logprobs, advantages, clip_range)
    with torch.no_grad():
        stats = {"clip_fraction": masked_mean(clipped, mask),
                 "approx_kl": masked_mean(kl_k2(logprobs, old_logprobs), mask)}
    return masked_mean(per_token, mask), stats


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                   mask: torch.Tensor, clip_range: float) -> tuple[torch.Tensor, dict]:
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


# --------------------------------------------------------------------------- aggregation
# How per-token losses become one number changes what a long answer weighs.


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GRPO (Shao et al. 2024, eq. 3): ``1/G sum_i 1/|o_i| sum_t l_{i,t}``."""
    return masked_mean(per_token, mask, dim=-1).mean()


def constant_normalized_sum(per_token: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, eq. 3): ``1/G sum_i 1/L sum_t l_{i,t}`` with a constant ``L``
    (the generation budget), so no length bias from dividing by ``|o_i|``."""
    return masked_sum(per_token, mask) / (per_token.shape[0] * max_tokens)
