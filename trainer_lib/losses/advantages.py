"""Masked statistics, advantage estimators (PPO, GRPO, RLOO, REINFORCE++) and DAPO's overlong reward
shaping. Tensors in, tensors out.

Shapes: ``(B, T)`` per-token tensors hold the response tokens of ``B`` sequences, right-padded;
``mask`` is 1 on response tokens (up to and including the eos) and 0 on padding. Group
methods take ``(B,)`` sequence rewards laid out as consecutive groups of ``group_size``
completions of the same prompt. Nothing here imports more than torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

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


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
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


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, eq. 11-16), ``(B, T)`` in and out.

        delta_t = r_t + gamma * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * A_{t+1}
        R_t     = A_t + V_t                       (the critic's regression target)

    The time steps are the positions where ``mask`` is 1, the model's own tokens: a position off the mask
    is skipped, so the next value of a token is that of the next token on the mask (in a multi-turn row,
    the first of the model's next turn, across the environment's tokens between). After the last one the
    value is 0: the episode ends with the model's last token. Advantages and returns are 0 off the mask.
    """
    mask = mask.to(values.dtype)
    values = values * mask
    rewards = rewards * mask
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    next_value = torch.zeros_like(running)
    for t in reversed(range(rewards.shape[-1])):
        on = mask[..., t] > 0
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        running = torch.where(on, delta + gamma * lam * running, running)
        next_value = torch.where(on, values[..., t], next_value)
        advantages[..., t] = running
    advantages = advantages * mask
    return advantages, (advantages + values) * mask


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.dim() != 1 or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)


def grpo_advantages(rewards: torch.Tensor, group_size: int, scale: bool = True, eps: float = 1e-4) -> torch.Tensor:
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


def kl_penalized_returns(rewards: torch.Tensor, kl: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """REINFORCE++ returns (Hu 2025, sec. 3.1): the sequence reward at the last token, a KL penalty at
    every token, summed to go without discount. ``rewards`` is ``(B,)``, ``kl`` and the result ``(B, T)``:

        r_t = 1[t = |y|] r(x, y) - beta * KL_t        KL_t = log pi_old(y_t) - log pi_ref(y_t)
        G_t = sum_{s >= t} r_s = r(x, y) - beta * sum_{s >= t} KL_s

    0 off the mask.
    """
    mask = mask.to(kl.dtype)
    kl_to_go = (kl * mask).flip(-1).cumsum(-1).flip(-1)
    return (rewards.to(kl.dtype).unsqueeze(-1) - beta * kl_to_go) * mask


def reinforce_pp_advantages(
    rewards: torch.Tensor,
    kl: torch.Tensor,
    mask: torch.Tensor,
    beta: float,
    reduce: Callable[[dict], dict] | None = None,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ advantages (Hu 2025, sec. 3.1-3.2), ``(B, T)``: the returns of
    :func:`kl_penalized_returns`, normalized over every response token of the global batch

        A_t = (G_t - mean(G)) / std(G)        (std Bessel-corrected, as ``torch.std``)

    instead of within a prompt's group. ``reduce`` sums ``{"sum", "sum_sq", "count"}`` over all
    ranks (None: this batch is the global batch). 0 off the mask.
    """
    returns = kl_penalized_returns(rewards, kl, mask, beta)
    mask = mask.to(returns.dtype)
    sums = {"sum": masked_sum(returns, mask), "sum_sq": masked_sum(returns**2, mask), "count": mask.sum()}
    sums = {k: float(v) for k, v in (reduce(sums) if reduce is not None else sums).items()}
    count = max(sums["count"], 1.0)
    mean = sums["sum"] / count
    var = max(sums["sum_sq"] / count - mean**2, 0.0) * (count / (count - 1) if count > 1 else 1.0)
    return (returns - mean) / math.sqrt(var + eps) * mask


# --------------------------------------------------------------------------- reward shaping


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, buffer: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), completion lengths ``(B,)`` in,
    penalties ``(B,)`` out, added to the reward:

        R_length(y) = 0                                   |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
                    = -1                                  L_max < |y|

    with ``L_max = max_tokens`` (the generation budget) and ``L_cache = buffer``, the window before
    it in which the penalty falls linearly from 0 to -1.
    """
    if buffer < 1 or buffer > max_tokens:
        raise ValueError(f"overlong_penalty: buffer must be in [1, max_tokens={max_tokens}], got {buffer}")
    free = max_tokens - buffer
    return ((free - lengths.to(torch.float32)) / buffer).clamp(min=-1.0, max=0.0)
