"""The action space of PPO's policy: every token, or NLPO's nucleus mask (Ramamurthy et al. 2023).

NLPO (Natural Language Policy Optimization, "Is Reinforcement Learning (Not) for Natural Language
Processing?", Algorithm 1) is PPO whose actions at each position are limited to the top-p tokens of
a *masking policy* pi_psi, a frozen copy of the policy refreshed every ``mu`` steps::

    for step s:
        if s mod mu == 0:  pi_psi <- pi_theta                         (MaskingPolicy.begin_step)
        sample with pi_theta(. | s_t), logits outside top_p(pi_psi(. | s_t)) set to -inf
        PPO update with log pi_theta renormalized over the same set      (MaskedActions.logprobs)

so the ratio and the KL to the reference are those of the masked policy. Both classes here have the
same methods, so PPO's loop has no NLPO branches:

* ``begin_step(step)``: before the step's rollout (NLPO: refresh the masking policy when due);
* ``logits_processor``: what the step's rollout samples through (None: the whole vocabulary; NLPO:
  the mask), handed by :func:`trainer_lib.rl.experience.sample_and_score` to
  :func:`trainer_lib.rl.rollout.generate`. Held-out evaluation samples unmasked, as the exported
  policy runs;
* ``logprobs(engine, part, temperature, entropy_grad)``: ``(log-probs, entropy, metrics)`` of a
  micro-batch under the current weights;
* ``rollout_logprobs(models, rollout, temperature, batch_size)``: the same for a whole rollout, without
  gradient (the log-probs of the weights that sampled it);
* ``stateful``: what the checkpoint must keep (NLPO: the masking policy).

The mask at sampling time is computed incrementally (the masking policy's own KV cache); the update
recomputes it with a full forward, where float rounding may move a token at the nucleus' edge. So
the update's set also holds the sampled token (its log-prob stays finite), and how often that was
needed is logged as ``nlpo/off_mask_fraction`` (0 in practice).
"""

from __future__ import annotations

import torch


def top_p_set(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Boolean ``(..., V)``: the nucleus of ``softmax(logits)`` (Holtzman et al. 2020), the smallest set
    of most likely tokens whose probability reaches ``top_p``; it always holds the most likely token,
    and every token when ``top_p >= 1``. Ties are broken by token id (a stable sort)."""
    if top_p >= 1:
        return torch.ones_like(logits, dtype=torch.bool)
    probs = torch.softmax(logits.float(), dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # of the tokens more likely than this one
    keep = mass_before < top_p
    return torch.zeros_like(keep).scatter(-1, order, keep)


class FullVocabulary:
    """PPO's and A2C's action space: every token of the vocabulary."""

    def __init__(self, passes=None):
        from trainer_lib.rl.update_passes import WholeSequences

        self.stateful = {}
        self.logits_processor = None
        self.passes = passes or WholeSequences()  # or a sequence group's split passes (rl/update_passes.py)

    def begin_step(self, step: int) -> None:
        """Nothing changes between steps."""

    def logprobs(self, engine, part, temperature: float, entropy_grad: bool = False):
        logprobs, entropy = self.passes.logprobs(engine, part, temperature, True, entropy_grad)
        return logprobs, entropy, {}

    def rollout_logprobs(self, models, rollout, temperature: float, batch_size: int):
        return models.actor_logprobs(rollout, temperature, batch_size)


class MaskingPolicy:
    """NLPO's masking policy: a frozen copy of the actor, refreshed from it every ``update_steps`` steps.

    It is one more full copy of the policy in accelerator memory (under LoRA: base and adapters). A
    checkpoint keeps the step it was copied at and, unless the next step refreshes it anyway, its
    trainable weights (the actor's trainable parameters at that step; the rest never change), so a
    resumed run masks exactly as the interrupted one would have.
    """

    def __init__(self, actor, frozen_copy, top_p: float, update_steps: int, temperature: float):
        self.actor, self.model = actor, frozen_copy
        self.top_p, self.update_steps, self.temperature = top_p, update_steps, temperature
        self.trainable = [name for name, param in actor.named_parameters() if param.requires_grad]
        self.copied_at, self.next_step = 0, 0

    def begin_step(self, step: int) -> None:
        """Algorithm 1's ``if s mod mu == 0: pi_psi <- pi_theta``, before step ``step``'s rollout."""
        if step % self.update_steps == 0:
            actor, params = dict(self.actor.named_parameters()), dict(self.model.named_parameters())
            with torch.no_grad():
                for name in self.trainable:
                    params[name].copy_(actor[name])
            self.copied_at = step
        self.next_step = step + 1

    def state_dict(self) -> dict:
        """Saved after step ``next_step - 1``: the weights are left out when step ``next_step`` copies anew."""
        params = dict(self.model.named_parameters())
        weights = (
            {} if self.next_step % self.update_steps == 0 else {n: params[n].detach().cpu() for n in self.trainable}
        )
        return {"copied_at": self.copied_at, "update_steps": self.update_steps, "weights": weights}

    def load_state_dict(self, state: dict) -> None:
        from trainer_lib.errors import ConfigError

        if state["update_steps"] != self.update_steps:
            raise ConfigError(
                f"nlpo.mask_update_steps: the checkpoint was written with {state['update_steps']}, this run "
                f"has {self.update_steps}; resume with the same value (or start a new output_dir)"
            )
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in state["weights"].items():
                params[name].copy_(value)
        self.copied_at = int(state["copied_at"])

    def logits(self, model_inputs: dict, width: int) -> torch.Tensor:
        """The masking policy's next-token logits at the ``width`` positions that predict response tokens."""
        with torch.no_grad():
            out = self.model(**model_inputs, use_cache=False, logits_to_keep=width + 1)
        return self.scaled(out.logits[:, :-1])

    def scaled(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits at the sampling temperature: the nucleus is that of the distribution sampled from."""
        logits = logits.float()
        return logits / self.temperature if self.temperature > 0 and self.temperature != 1.0 else logits

    def processor(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
        """A transformers LogitsProcessor for one ``generate`` call on these left-padded prompts."""
        from transformers import LogitsProcessor

        policy = self

        class NucleusMask(LogitsProcessor):
            """Sets the logits outside the masking policy's nucleus to -inf; runs the masking policy
            one token at a time on its own KV cache, as generate runs the actor."""

            def __init__(self):
                self.cache, self.seen = None, 0

            def __call__(self, input_ids, scores):
                grown = input_ids.shape[1] - prompt_mask.shape[1]  # tokens generated so far
                ones = prompt_mask.new_ones((prompt_mask.shape[0], grown))
                attention_mask = torch.cat([prompt_mask, ones], dim=1)
                positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
                with torch.no_grad():
                    out = policy.model(
                        input_ids=input_ids[:, self.seen :],
                        attention_mask=attention_mask,
                        position_ids=positions[:, self.seen :],
                        cache=self.cache,
                        use_cache=True,
                        logits_to_keep=1,
                    )
                self.cache, self.seen = out.cache, input_ids.shape[1]
                allowed = top_p_set(policy.scaled(out.logits[:, -1]), policy.top_p)
                return scores.masked_fill(~allowed, float("-inf"))

        return NucleusMask()


class MaskedActions:
    """NLPO's action space: sampling and log-probs restricted to the masking policy's nucleus."""

    def __init__(self, masking: MaskingPolicy):
        self.masking = masking
        self.stateful = {"nlpo_masking_policy": masking}
        self.logits_processor = masking.processor  # every sampled token is inside the nucleus

    def begin_step(self, step: int) -> None:
        self.masking.begin_step(step)

    def allowed(self, part) -> tuple[torch.Tensor, dict]:
        """``(N, R, V)`` tokens allowed at each response position: the nucleus, plus the sampled token;
        and the mean nucleus size and share of sampled tokens outside it, over response tokens."""
        device = next(self.masking.model.parameters()).device
        width = part.response_ids.shape[1]
        nucleus = top_p_set(self.masking.logits(part.model_inputs(device), width), self.masking.top_p)
        targets = part.response_ids.to(device).unsqueeze(-1)
        mask = part.loss_mask.to(device).float()
        outside = (~nucleus.gather(-1, targets)).squeeze(-1).float()
        tokens = mask.sum().clamp(min=1)
        metrics = {
            "nlpo/mask_tokens": (nucleus.sum(-1) * mask).sum() / tokens,
            "nlpo/off_mask_fraction": (outside * mask).sum() / tokens,
        }
        return nucleus.scatter(-1, targets, True), metrics

    def logprobs(self, engine, part, temperature: float, entropy_grad: bool = False):
        from trainer_lib.rl.rollout import token_logprobs

        allowed, metrics = self.allowed(part)
        logprobs, entropy = token_logprobs(
            engine, part, temperature, with_entropy=True, entropy_grad=entropy_grad, allowed=allowed
        )
        return logprobs, entropy, metrics

    def rollout_logprobs(self, models, rollout, temperature: float, batch_size: int):
        from trainer_lib.rl import experience

        with torch.no_grad():
            return experience.per_micro_batch(
                lambda part: self.logprobs(models.actor_engine, part, temperature)[0], rollout, batch_size
            )
