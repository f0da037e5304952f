"""Preference losses: pure functions, tensors of shape ``(B,)`` in, per-example loss ``(B,)`` out.

Notation (as in the papers): ``x`` a prompt, ``y_w`` the chosen and ``y_l`` the rejected
completion, ``log pi(y|x)`` a sequence log-probability **summed** over completion tokens
(SimPO: averaged), ``pi_ref`` the reference model, ``sigma`` the logistic function and

    h = [log pi(y_w|x) - log pi_ref(y_w|x)] - [log pi(y_l|x) - log pi_ref(y_l|x)]

the difference of implicit log-ratios. The callers average the returned losses; the reference
log-probs are treated as constants (no gradient flows into them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _log_ratio_margin(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
) -> torch.Tensor:
    """h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))."""
    return (policy_chosen_logps - reference_chosen_logps.detach()) - (
        policy_rejected_logps - reference_rejected_logps.detach()
    )


def dpo_sigmoid_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """DPO (Rafailov et al. 2023, eq. 7), with conservative label smoothing (cDPO, Mitchell 2023).

        L = -(1 - eps) * log sigma(beta * h) - eps * log sigma(-beta * h)

    ``eps = label_smoothing`` is the assumed probability that a pair's label is flipped;
    ``eps = 0`` is the original DPO loss ``-log sigma(beta * h)``.
    """
    logits = beta * _log_ratio_margin(
        policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps
    )
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def beta_dpo_beta(
    margins: torch.Tensor, margin_mean: float, beta: float, alpha: float, min_beta: float = 1e-3
) -> torch.Tensor:
    """beta-DPO's batch-level beta (Wu et al. 2024, "beta-DPO", sec. 4, batch-level dynamic beta calibration):

        beta_batch = beta_0 * (1 + alpha * (mean_i M_i - M_0))

    ``margins`` are the batch's (kept) reward discrepancies ``M_i``, taken as the log-ratio margin ``h``
    (as the authors' code does, so ``alpha`` does not scale with ``beta_0``); ``margin_mean`` is
    ``M_0``, a running mean of past margins. A batch of wider margins (easier or noisier pairs) gets a
    larger, more conservative beta; a narrow one a smaller beta. Clamped below at ``min_beta`` so a
    very narrow batch cannot flip the loss's sign (the authors clamp at 1e-3 too). No gradient.
    """
    mean = margins.detach().mean()
    return (beta * (1.0 + alpha * (mean - margin_mean))).clamp(min=min_beta)


def margin_filter_weights(margins: torch.Tensor, margin_mean: float, margin_std: float) -> torch.Tensor:
    """beta-DPO's data-filtering weights (Wu et al. 2024, sec. 4, beta-guided data filtering):

        p(M_i) proportional to exp(-(M_i - M_0)^2 / (2 sigma^2))

    a Gaussian around the running mean ``M_0`` with the running standard deviation ``sigma``; pairs far
    from the usual margin in either direction (outliers, likely mislabelled or trivially easy) get
    small weights. ``sigma <= 0`` (no spread seen yet): all weights 1.
    """
    margins = margins.detach()
    if not margin_std > 0:
        return torch.ones_like(margins)
    return torch.exp(-0.5 * ((margins - margin_mean) / margin_std) ** 2)


def margin_filter_mask(
    margins: torch.Tensor, margin_mean: float, margin_std: float, ratio: float, generator: torch.Generator
) -> torch.Tensor:
    """beta-DPO's filter (Wu et al. 2024, sec. 4, beta-guided filtering): drop a share ``ratio`` (rho) of a batch.

    ``max(1, int(B * (1 - ratio)))`` pairs are kept, drawn without replacement with probabilities
    proportional to :func:`margin_filter_weights`, from ``generator`` (a CPU generator: the caller seeds
    it, so a resumed run draws the same pairs). Returns a bool mask ``(B,)`` on the margins' device.
    """
    weights = margin_filter_weights(margins, margin_mean, margin_std).to("cpu", torch.float64)
    if not (weights.sum() > 0 and torch.isfinite(weights).all()):  # all underflowed, or a non-finite margin
        weights = torch.ones_like(weights)
    count = max(1, int(weights.numel() * (1.0 - ratio)))
    chosen = torch.multinomial(weights, count, replacement=False, generator=generator)
    mask = torch.zeros(weights.numel(), dtype=torch.bool)
    mask[chosen] = True
    return mask.to(margins.device)


def beta_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
    alpha: float,
    margin_mean: float,
    keep: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """beta-DPO (Wu et al. 2024, sec. 4): the DPO loss at the batch's calibrated beta, on the kept pairs.

        L_i = keep_i * B / sum_j keep_j * DPO_i(beta_batch)     (beta_batch from :func:`beta_dpo_beta`)

    ``keep`` (bool ``(B,)``, None: all) marks the pairs the margin filter kept; beta_batch comes from
    their margins, and the dropped pairs' losses are 0 with the others rescaled so that the mean of
    the returned ``(B,)`` losses is the mean over the kept pairs. ``alpha = 0`` with every pair kept
    is plain DPO (eq. 7 of Rafailov et al. 2023). Returns ``(losses, beta_batch)``.
    """
    h = _log_ratio_margin(policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps)
    kept = h if keep is None else h[keep]
    if alpha:
        beta_batch = beta_dpo_beta(kept, margin_mean, beta, alpha)
        logits = beta_batch.to(h.dtype) * h
    else:  # the fixed beta, multiplied exactly as dpo_sigmoid_loss does
        beta_batch = torch.tensor(float(beta), dtype=h.dtype)
        logits = beta * h
    losses = -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)
    if keep is not None:
        keep = keep.to(losses.dtype)
        losses = losses * keep * (keep.numel() / keep.sum().clamp(min=1.0))
    return losses, beta_batch


def ipo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """IPO (Azar et al. 2023, sec. 5.1, empirical IPO loss), with ``beta`` playing the paper's regulariser ``tau``.

        L = (h - 1 / (2 * beta))^2

    A squared loss that pulls the log-ratio margin to a finite target instead of to infinity.
    """
    h = _log_ratio_margin(policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps)
    return (h - 1.0 / (2.0 * beta)) ** 2


def hinge_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """SLiC-HF rank-calibration hinge loss (Zhao et al. 2023) on reference-normalized log-probs.

        L = max(0, 1 - beta * h)

    i.e. the paper's margin ``delta = 1 / beta`` on the log-likelihood ratio (as in DPO's
    unified view, Rafailov et al. 2023 sec. 5 / Zhao et al.'s rank calibration).
    """
    h = _log_ratio_margin(policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps)
    return torch.relu(1.0 - beta * h)


def robust_dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    reference_chosen_logps: torch.Tensor,
    reference_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float,
) -> torch.Tensor:
    """Robust DPO (Chowdhury et al. 2024, "Provably Robust DPO"): an unbiased loss under label-flip rate ``eps``.

        L = [-(1 - eps) * log sigma(beta * h) + eps * log sigma(-beta * h)] / (1 - 2 * eps)

    Needs ``0 <= eps < 0.5``; ``eps = 0`` is plain DPO.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"robust DPO needs 0 <= label_smoothing < 0.5, got {label_smoothing}")
    logits = beta * _log_ratio_margin(
        policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps
    )
    return (-(1.0 - label_smoothing) * F.logsigmoid(logits) + label_smoothing * F.logsigmoid(-logits)) / (
        1.0 - 2.0 * label_smoothing
    )


def simpo_loss(
    policy_chosen_avg_logps: torch.Tensor, policy_rejected_avg_logps: torch.Tensor, beta: float, gamma: float
) -> torch.Tensor:
    """SimPO (Meng et al. 2024, eq. 6): reference-free, length-normalized, target margin ``gamma``.

        L = -log sigma(beta / |y_w| * log pi(y_w|x) - beta / |y_l| * log pi(y_l|x) - gamma)

    The inputs are log-probs *averaged* over completion tokens (``log pi(y|x) / |y|``).
    """
    return -F.logsigmoid(beta * (policy_chosen_avg_logps - policy_rejected_avg_logps) - gamma)


def rpo_nll_term(policy_chosen_logps: torch.Tensor, chosen_tokens: torch.Tensor) -> torch.Tensor:
    """RPO's negative log-likelihood term (Pang et al. 2024, "Iterative Reasoning Preference
    Optimization", eq. 3): the chosen completion's NLL, length-normalized.

        L_NLL = -log pi(y_w|x) / |y_w|

    Added to a preference loss with weight ``alpha`` (L = L_DPO + alpha * L_NLL), it keeps the chosen
    completions likely while the margin grows: plain DPO may push both log-probs down.
    """
    return -policy_chosen_logps / chosen_tokens.clamp(min=1).to(policy_chosen_logps.dtype)


def kto_loss(
    policy_logps: torch.Tensor,
    reference_logps: torch.Tensor,
    desirable: torch.Tensor,
    reference_point: torch.Tensor | float,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """KTO (Ethayarajh et al. 2024, the KTO loss of sec. 4) on unpaired completions.

        r(x, y) = log pi(y|x) - log pi_ref(y|x)
        v(x, y) = lambda_D * sigma(beta * (r - z0))   if y is desirable
                  lambda_U * sigma(beta * (z0 - r))   if y is undesirable
        L       = lambda_y - v(x, y)

    ``policy_logps``/``reference_logps``: summed log-probs ``(B,)``; ``desirable``: bool ``(B,)``;
    ``reference_point`` ``z0``: the KL estimate from :func:`kto_reference_point` (a constant).
    ``desirable_weight``/``undesirable_weight`` are ``lambda_D``/``lambda_U``.
    """
    log_ratio = policy_logps - reference_logps.detach()
    z0 = torch.as_tensor(reference_point, dtype=log_ratio.dtype, device=log_ratio.device).detach()
    desirable = desirable.to(torch.bool)
    gain = desirable_weight * (1.0 - torch.sigmoid(beta * (log_ratio - z0)))
    loss_avoidance = undesirable_weight * (1.0 - torch.sigmoid(beta * (z0 - log_ratio)))
    return torch.where(desirable, gain, loss_avoidance)


def kto_reference_point(
    policy_mismatched_logps: torch.Tensor, reference_mismatched_logps: torch.Tensor
) -> torch.Tensor:
    """KTO's ``z0`` (Ethayarajh et al. 2024, sec. 4.1): a biased estimate of KL(pi || pi_ref).

        z0 = max(0, mean_j [log pi(y_j|x_i) - log pi_ref(y_j|x_i)])

    over completions ``y_j`` paired with *unrelated* prompts ``x_i``; no gradient flows through it.
    """
    kl = (policy_mismatched_logps - reference_mismatched_logps).mean()
    return kl.clamp(min=0.0).detach()


def pairwise_reward_loss(
    chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor, margin: torch.Tensor | None = None
) -> torch.Tensor:
    """Bradley-Terry reward-model loss (Ouyang et al. 2022, eq. 1), with Llama 2's margin.

        L = -log sigma(r(x, y_w) - r(x, y_l) - m)

    ``margin`` ``m`` (Touvron et al. 2023, eq. 2) is a per-pair ``(B,)`` tensor or None (0).
    """
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        diff = diff - margin
    return -F.logsigmoid(diff)


def reward_centering_penalty(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """Auxiliary term that keeps rewards centred on zero (Eisenstein et al. 2023).

        P = (r(x, y_w) + r(x, y_l))^2

    The Bradley-Terry loss only sees reward differences; this pins the free offset.
    """
    return (chosen_rewards + rejected_rewards) ** 2
