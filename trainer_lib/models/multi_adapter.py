"""One frozen base model shared by the RL roles through PEFT adapters (``multi_adapter=true``).

    role        adapter                      head           trained
    policy      "default"                    lm_head        yes, at lr
    value       "value" (PPO)                value_head     yes, at critic_lr
    reference   none: ``disable_adapter()``  lm_head        no
    reward      "reward" (a LoRA reward      reward_head    no
                model of the same base)

Instead of four models (actor, critic, reference, reward model) the process holds one base,
a few adapters and two ``hidden x 1`` heads. The PeftModel is the module DeepSpeed wraps: the heads
are attached to it as submodules, so one engine holds every trainable parameter, its forward is
the policy's (generation, log-probs and the reference through ``disable_adapter()`` work as for
any LoRA policy), and the final save sees a plain PeftModel once :meth:`SharedBase.keep_policy_only`
has deleted the other adapters.

Invariant: the policy adapter is the active one, except inside :meth:`SharedBase.use`, which
switches with PEFT's ``set_adapter`` and switches back. ``set_adapter`` also marks the adapter
it activates trainable and the others frozen; the trainable set is put back after every switch,
so ZeRO's gradient hooks (registered on trainable parameters once) keep seeing the same ones.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
from types import SimpleNamespace

from trainer_lib.errors import UserError

POLICY, VALUE, REWARD = "default", "value", "reward"  # "default": PEFT's name for the first adapter
#: The reward stage's scalar head, saved in a LoRA reward model's adapter file (``modules_to_save``).
SCORE_KEY = "base_model.model.score.weight"


def adapter_dir(path: str | None, key: str) -> str | None:
    """The local directory of ``path`` if it holds a PEFT adapter (``adapter_config.json``), else None."""
    if not path:
        return None
    from trainer_lib.models.load import resolve_model_path

    local = resolve_model_path(path, key)
    return local if os.path.isfile(os.path.join(local, "adapter_config.json")) else None


class SharedBase:
    """The PeftModel (``model``) with its adapters and heads, and a forward pass per role."""

    def __init__(self, model, trainable: list[str], frozen: list[str]):
        self.model, self.trainable, self.frozen = model, trainable, frozen
        self._restore_trainable()

    def _restore_trainable(self) -> None:
        self.model.set_requires_grad(self.trainable, True)
        if self.frozen:
            self.model.set_requires_grad(self.frozen, False)

    @contextlib.contextmanager
    def use(self, adapter: str):
        """Within it, ``adapter`` is the active adapter; the policy's again afterwards."""
        self.model.set_adapter(adapter)
        self._restore_trainable()
        try:
            yield
        finally:
            self.model.set_adapter(POLICY)
            self._restore_trainable()

    @contextlib.contextmanager
    def disabled(self):
        """Within it, every adapter is off: the frozen base, i.e. the reference policy. (PEFT's
        ``disable_adapter()`` freezes every adapter and, leaving, unfreezes only the active one.)"""
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self._restore_trainable()

    def reference(self):
        """The reference policy (the base, adapters off) in the call shape of a causal LM, for
        :func:`trainer_lib.rl.rollout.token_logprobs`."""
        return _View(self, self.disabled, lambda shared, **inputs: shared.model(**inputs))

    def hidden_states(self, inputs: dict):
        """The backbone's last hidden states ``(N, T, H)`` (final norm applied, no LM head): what a
        ``*ForSequenceClassification`` head reads."""
        base = self.model.get_base_model()
        backbone = getattr(base, base.base_model_prefix)
        return backbone(**inputs, use_cache=False).last_hidden_state

    def token_values(self, rollout):
        """Values ``(N, R)`` with the value adapter and head, read at the positions that predict each
        response token (as :func:`trainer_lib.rl.actor_critic.critic_token_values` reads a critic model)."""
        device = next(self.model.parameters()).device
        with self.use(VALUE):
            hidden = self.hidden_states(rollout.model_inputs(device))
        width = rollout.response_ids.shape[1]
        values = self.model.value_head(hidden[:, -(width + 1) : -1]).squeeze(-1).float()
        return values * rollout.response_mask.to(values.device)

    def reward_model(self):
        """The reward adapter and head in the call shape of a sequence-classification model (what
        :class:`trainer_lib.rewards.model.RewardModelScorer` calls): right-padded inputs, the head
        read at each row's last real token. None without a reward adapter."""
        if REWARD not in self.frozen:
            return None
        return _View(self, lambda: self.use(REWARD), _sequence_reward)

    def keep_policy_only(self) -> None:
        """Delete every adapter but the policy's, before the final save (merged, or the adapter alone)."""
        for name in [n for n in self.model.peft_config if n != POLICY]:
            self.model.delete_adapter(name)
        self.trainable, self.frozen = [POLICY], []


class _View:
    """One role of the shared model as a model-like callable: ``forward(shared, **inputs)`` run
    without gradients inside ``context()``."""

    def __init__(self, shared: SharedBase, context, forward):
        self.shared, self.context, self.forward = shared, context, forward

    def parameters(self):
        return self.shared.model.parameters()

    def __call__(self, **inputs):
        import torch

        with torch.no_grad(), self.context():
            return self.forward(self.shared, **inputs)


def _sequence_reward(shared: SharedBase, input_ids, attention_mask, **_):
    import torch

    hidden = shared.hidden_states({"input_ids": input_ids, "attention_mask": attention_mask})
    last = (attention_mask.sum(1) - 1).clamp(min=0)  # right padding: the last real token
    pooled = hidden[torch.arange(len(hidden), device=hidden.device), last]
    return SimpleNamespace(logits=shared.model.reward_head(pooled))


def _head(hidden: int, like, weight=None):
    """A bias-free ``hidden -> 1`` linear head (as ``*ForSequenceClassification.score``), in the
    base's dtype and device; ``weight`` copied in, else initialised like transformers' heads."""
    import torch

    head = torch.nn.Linear(hidden, 1, bias=False, dtype=like.dtype, device=like.device)
    with torch.no_grad():
        if weight is not None:
            head.weight.copy_(weight.to(like.dtype))
        else:
            head.weight.normal_(0.0, 0.02)
    return head


def _adapter_head(path: str):
    """The score head saved with a LoRA reward model's adapter, or None."""
    from safetensors import safe_open

    file = os.path.join(path, "adapter_model.safetensors")
    if not os.path.exists(file):
        return None
    with safe_open(file, framework="pt") as fh:
        return fh.get_tensor(SCORE_KEY) if SCORE_KEY in fh.keys() else None


def _check_base(path: str, key: str, model_path: str, strategy) -> None:
    """A LoRA adapter only fits the base it was trained on; say so when its recorded base differs."""
    with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as fh:
        recorded = json.load(fh).get("base_model_name_or_path") or ""
    if recorded and os.path.normpath(recorded) != os.path.normpath(model_path):
        strategy.print(
            f"note: {key}: the adapter at {path} was trained on {recorded}; multi_adapter loads it on "
            f"model.path={model_path} (they must be the same weights)"
        )


def build(cfg, strategy, with_value: bool) -> SharedBase:
    """model.path with LoRA (the policy), plus a LoRA reward model of it as the frozen "reward"
    adapter when ``reward.model_path`` is one, plus (``with_value``) the trainable "value" adapter
    and head: from ``critic.path`` or the reward adapter when either is a LoRA of the base
    (as the separate critic starts from the reward model), else new."""
    from trainer_lib.errors import ConfigError
    from trainer_lib.models.load import apply_lora, load_causal_lm

    if strategy.zero_stage == 3:  # also when set by engine.deepspeed_config, which validate() does not read
        raise ConfigError(
            "multi_adapter: not supported with ZeRO stage 3 (engine.deepspeed_config sets it); use ZeRO 0-2"
        )
    model = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision, placement=strategy.placement()), cfg.lora)
    hidden = model.get_base_model().config.hidden_size
    like = model.get_base_model().get_input_embeddings().weight
    frozen = []
    reward_path = adapter_dir(cfg.reward.model_path, "reward.model_path")
    if reward_path:
        _check_base(reward_path, "reward.model_path", cfg.model.path, strategy)
        model.load_adapter(reward_path, adapter_name=REWARD, is_trainable=False)
        score = _adapter_head(reward_path)
        if score is None:
            raise UserError(
                f"reward.model_path: {cfg.reward.model_path} is a LoRA adapter without a score head "
                f"({SCORE_KEY}); expected a reward model saved by `posttrain reward` with lora.merge=false"
            )
        model.add_module("reward_head", _head(hidden, like, score).requires_grad_(False))
        frozen.append(REWARD)
    trainable = [POLICY]
    if with_value:
        critic = getattr(getattr(cfg, "critic", None), "path", None)
        value_init = adapter_dir(critic, "critic.path") if critic else reward_path
        if critic and not value_init:
            raise UserError(
                f"critic.path: {critic}: with multi_adapter=true the critic must be a LoRA adapter of "
                f"model.path (e.g. a reward model saved with lora.merge=false), or unset"
            )
        if value_init:
            model.load_adapter(value_init, adapter_name=VALUE, is_trainable=True)
        else:
            model.add_adapter(VALUE, copy.deepcopy(model.peft_config[POLICY]))
        model.add_module("value_head", _head(hidden, like, _adapter_head(value_init) if value_init else None))
        trainable.append(VALUE)
    model.set_adapter(POLICY)
    return SharedBase(model, trainable, frozen)


def param_group(name: str, lr: float, critic_lr: float) -> tuple[str, float]:
    """(optimizer group, learning rate) of a trainable parameter of the shared model: the value
    adapter and head at ``critic_lr``, the policy adapter at ``lr``."""
    if name.startswith("value_head.") or re.search(rf"\.lora_\w+\.{VALUE}\.", name):
        return VALUE, critic_lr
    return POLICY, lr


def freeze_policy_group(engine, frozen: bool) -> None:
    """With ``frozen``, this optimizer step leaves the policy adapter as it is (lr 0: no Adam update,
    no weight decay); the LR scheduler sets the group's scheduled lr again after the step."""
    if frozen:
        for group in engine.optimizer.param_groups:
            if group.get("name") == POLICY:
                group["lr"] = 0.0
