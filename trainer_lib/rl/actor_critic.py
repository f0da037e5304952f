"""The models of an RL stage in one of two layouts with the same methods, so a loop has no layout branches.

    role          SeparateModels                      SharedBaseModels (``multi_adapter=true``)
    actor         its own DeepSpeed engine            the policy adapter  } one engine on
    critic (PPO)  its own DeepSpeed engine            the value adapter   } one frozen base
                                                      and value head      }
    reference     a frozen copy of the policy (LoRA:  the base with adapters disabled
                  the actor with adapters disabled)
    reward model  loaded by the reward sources        a frozen reward adapter (a LoRA of the base)

As OpenRLHF gives actor and critic their own classes, each layout is a small class and
:func:`build_models` builds the configured one once. PPO uses all of it; GRPO builds it without a
critic and uses the actor engine, the reference and the reward sources. What a loop calls:

* ``actor_engine``: generation, log-probs and evaluation, and the cadence's main engine (``actor``:
  the module it wraps, ``trainable``: what its trainable parameters are, for the start banner);
* ``actor_logprobs(rollout, temperature, batch_size)``: the actor's token log-probs, ``(N, R)``;
* ``token_values(rollout)``: the critic's value at every response token, ``(N, R)``;
* ``reference_logprobs(rollout, temperature, batch_size)``: the reference's token log-probs, or None
  without a reference;
* ``rewards``: the configured reward sources;
* ``update(policy_loss, weighted_value_loss, train_actor)``: the layout's backward passes and
  optimizer steps for one mini-batch; ``weighted_value_loss`` is a function the layout calls when
  the critic may run (separate engines: after the actor's step, so the two graphs never coexist);
* ``extra_engines`` and ``log_extra()``: what the cadence checkpoints and logs besides the actor;
* ``masking_copy``: built with ``with_masking_copy`` (NLPO, separate models only), a frozen copy of the
  actor as it was before its engine was made (so without DeepSpeed's hooks), else None;
* ``keep_policy_only()``: before the final save, drop everything that is not the policy.
"""

from __future__ import annotations

from collections.abc import Callable


class _ActorAndReference:
    """What both layouts hold: the actor and its engine, the reference and the reward sources."""

    trainable = "the actor's"

    def __init__(self, strategy, actor, actor_engine, reference, use_reference: bool, rewards):
        self.strategy, self.actor, self.actor_engine = strategy, actor, actor_engine
        self.reference, self.use_reference, self.rewards = reference, use_reference, rewards

    def actor_logprobs(self, rollout, temperature: float, batch_size: int):
        """Token log-probs ``(N, R)`` of the rollout under the actor's current weights, a micro-batch
        at a time (call it under ``torch.no_grad()``)."""
        from trainer_lib.rl import experience
        from trainer_lib.rl.rollout import token_logprobs

        return experience.per_micro_batch(
            lambda part: token_logprobs(self.actor_engine, part, temperature)[0], rollout, batch_size
        )

    def reference_logprobs(self, rollout, temperature: float, batch_size: int):
        """Token log-probs ``(N, R)`` of the rollout under the reference policy; None without one."""
        if not self.use_reference:
            return None
        from trainer_lib.rl import experience

        return experience.per_micro_batch(
            lambda part: experience.reference_logprobs(self.reference, self.actor_engine, part, temperature),
            rollout,
            batch_size,
        )


class SeparateModels(_ActorAndReference):
    """Actor and critic as two DeepSpeed engines, each with its own optimizer and LR schedule; the
    reference a frozen copy of the policy (None under LoRA: the actor with its adapters disabled)."""

    def __init__(
        self,
        strategy,
        actor,
        actor_engine,
        reference,
        use_reference: bool,
        rewards,
        critic_engine=None,
        masking_copy=None,
    ):
        super().__init__(strategy, actor, actor_engine, reference, use_reference, rewards)
        self.critic_engine, self.masking_copy = critic_engine, masking_copy
        self.extra_engines = {"critic": critic_engine} if critic_engine is not None else {}

    def token_values(self, rollout):
        """The critic's values ``(N, R)`` (:func:`critic_token_values`)."""
        return critic_token_values(self.critic_engine, rollout)

    def update(self, policy_loss, weighted_value_loss: Callable, train_actor: bool) -> None:
        """A step of the actor on the policy loss (none while it is frozen), then one of the critic on
        ``weighted_value_loss()``, computed only after the actor's step has freed the actor's graph."""
        if train_actor:
            self.strategy.backward(policy_loss, self.actor_engine)
            self.strategy.optimizer_step(self.actor_engine)
        self.strategy.backward(weighted_value_loss(), self.critic_engine)
        self.strategy.optimizer_step(self.critic_engine)

    def log_extra(self) -> dict:
        """The critic's lr and gradient norm."""
        return {
            "critic_lr": self.critic_engine.get_lr()[0],
            "critic_grad_norm": self.strategy.grad_norm(self.critic_engine),
        }

    def keep_policy_only(self) -> None:
        """Nothing to drop: the actor is the policy alone."""

    @classmethod
    def build(
        cls,
        cfg,
        strategy,
        tokenizer,
        updates: int,
        actor_updates: int,
        use_reference: bool,
        with_critic: bool,
        with_masking_copy: bool = False,
    ):
        """Actor (``actor_updates`` steps) and, ``with_critic``, critic (``updates`` steps, ``critic_lr``);
        ``with_masking_copy``, a frozen copy of the initial actor."""
        import copy

        from trainer_lib.models.load import apply_lora, disable_dropout, load_causal_lm
        from trainer_lib.rl import experience

        # actor, then critic, then their engines: LoRA weights and a new value head draw from the
        # seeded RNG, so this order fixes the initial weights
        actor = apply_lora(load_causal_lm(cfg.model, cfg.engine.precision, placement=strategy.placement()), cfg.lora)
        critic = load_critic(cfg, tokenizer.pad_token_id, len(tokenizer), strategy.placement()) if with_critic else None
        disable_dropout(actor)
        masking_copy = copy.deepcopy(actor) if with_masking_copy else None  # before the engine adds its hooks
        actor_engine = strategy.prepare(actor, total_steps=actor_updates, **cfg.optimizer_args())
        critic_engine = None
        if critic is not None:
            disable_dropout(critic)
            critic_args = {**cfg.optimizer_args(), "lr": cfg.critic_lr or cfg.lr}
            critic_engine = strategy.prepare(critic, total_steps=updates, **critic_args)
        reference = experience.load_reference(cfg, strategy) if use_reference else None
        rewards = experience.build_rewards(cfg, strategy, tokenizer)
        if masking_copy is not None:
            masking_copy = strategy.prepare_frozen(masking_copy)
        return cls(strategy, actor, actor_engine, reference, use_reference, rewards, critic_engine, masking_copy)


class SharedBaseModels(_ActorAndReference):
    """One frozen base with adapters (:mod:`trainer_lib.models.multi_adapter`): ONE engine trains the
    policy adapter and (PPO) the value adapter and head, the latter in a parameter group at ``critic_lr``.
    Unlike two engines, the gradient is clipped as one vector and the policy's LR schedule counts
    from step 0."""

    def __init__(self, strategy, shared, actor_engine, reference, use_reference: bool, rewards):
        from trainer_lib.models.multi_adapter import VALUE

        super().__init__(strategy, shared.model, actor_engine, reference, use_reference, rewards)
        self.shared, self.masking_copy = shared, None
        self.extra_engines = {}  # the one engine is the actor's
        if VALUE in shared.trainable:
            self.trainable = "the actor's, the value adapter and head"

    def token_values(self, rollout):
        """The value adapter's and head's values ``(N, R)``."""
        return self.shared.token_values(rollout)

    def update(self, policy_loss, weighted_value_loss: Callable, train_actor: bool) -> None:
        """ONE step on ``weighted_value_loss() + policy_loss``; while the actor is frozen the policy term is
        left out and the policy group's lr is 0 for the step."""
        from trainer_lib.models import multi_adapter

        multi_adapter.freeze_policy_group(self.actor_engine, frozen=not train_actor)
        loss = weighted_value_loss() + (policy_loss if train_actor else 0.0)
        self.strategy.backward(loss, self.actor_engine)
        self.strategy.optimizer_step(self.actor_engine)

    def log_extra(self) -> dict:
        """The value group's lr (the engine's gradient norm, logged as grad_norm, covers both adapters)."""
        from trainer_lib.models.multi_adapter import VALUE

        return {"critic_lr": next(g["lr"] for g in self.actor_engine.optimizer.param_groups if g.get("name") == VALUE)}

    def keep_policy_only(self) -> None:
        """The output is the policy (merged per lora.merge), as without multi_adapter."""
        self.shared.keep_policy_only()

    @classmethod
    def build(cls, cfg, strategy, tokenizer, updates: int, use_reference: bool, with_critic: bool):
        """The shared base with the policy adapter (and, ``with_critic``, the value adapter and head) in
        one engine of ``updates`` steps."""
        import functools

        from trainer_lib.models import multi_adapter
        from trainer_lib.models.load import disable_dropout
        from trainer_lib.rl import experience

        shared = multi_adapter.build(cfg, strategy, with_value=with_critic)
        disable_dropout(shared.model)
        groups = None  # with a critic: the value adapter and head in their own group at critic_lr
        if with_critic:
            groups = functools.partial(multi_adapter.param_group, lr=cfg.lr, critic_lr=cfg.critic_lr or cfg.lr)
        engine = strategy.prepare(shared.model, total_steps=updates, **cfg.optimizer_args(), param_group=groups)
        reference = shared.reference() if use_reference else None
        rewards = experience.build_rewards(cfg, strategy, tokenizer, reward_model=shared.reward_model())
        return cls(strategy, shared, engine, reference, use_reference, rewards)


def build_models(
    cfg,
    strategy,
    tokenizer,
    updates: int,
    *,
    use_reference: bool,
    with_critic: bool = False,
    actor_updates=None,
    with_masking_copy: bool = False,
) -> SeparateModels | SharedBaseModels:
    """The layout ``cfg.multi_adapter`` picks, its engines prepared for ``updates`` optimizer steps
    (separate engines: the actor's for ``actor_updates``, default ``updates``); ``with_critic`` adds PPO's
    critic (``cfg.critic.path``, ``cfg.critic_lr``), ``use_reference`` the reference policy,
    ``with_masking_copy`` NLPO's frozen copy of the initial actor (separate models only)."""
    from trainer_lib.errors import UserError
    from trainer_lib.rl import experience

    if (with_critic or cfg.multi_adapter) and experience.policy_processor(cfg.model, tokenizer) is not None:
        raise UserError(
            f"model.path: {cfg.model.path} is a vision-language model; of the online RL stages only GRPO (and RLOO) "
            "without multi_adapter trains one (a critic or a shared base does not take images yet)"
        )
    if cfg.multi_adapter:
        if with_masking_copy:
            raise ValueError("build_models: a masking copy needs separate models (multi_adapter=false)")
        return SharedBaseModels.build(cfg, strategy, tokenizer, updates, use_reference, with_critic)
    actor_updates = updates if actor_updates is None else actor_updates
    return SeparateModels.build(
        cfg, strategy, tokenizer, updates, actor_updates, use_reference, with_critic, with_masking_copy
    )


# --------------------------------------------------------------------------- the separate critic


def load_critic(cfg, pad_token_id: int, vocab: int, placement=None):
    """PPO's critic, a sequence-classification model (scalar head ``score``) read at every token: from
    ``critic.path``, else the reward model, else the policy with a new head; it must share the
    policy's tokenizer. ``placement``: where its weights load (``strategy.placement()``)."""
    from trainer_lib.errors import UserError
    from trainer_lib.models.heads import apply_reward_lora, load_reward_model

    key = "critic.path" if cfg.critic.path else "reward.model_path" if cfg.reward.model_path else "model.path"
    path = cfg.critic.path or cfg.reward.model_path or cfg.model.path
    # model.revision pins the policy only
    critic = load_reward_model(cfg.model, pad_token_id, cfg.engine.precision, path, placement, key)
    if critic.config.vocab_size < vocab:
        raise UserError(
            f"critic.path: {path} has a vocabulary of {critic.config.vocab_size} tokens, the policy's "
            f"tokenizer {vocab}; the critic must share the policy's tokenizer"
        )
    return apply_reward_lora(critic, cfg.lora)


def critic_token_values(critic, rollout):
    """Critic values ``(N, R)``: the scalar head read at the positions that predict each response
    token, i.e. V(prompt, response_<t)."""
    scores = _head_outputs(critic, rollout.model_inputs(next(critic.parameters()).device))
    width = rollout.response_ids.shape[1]
    return scores[:, -(width + 1) : -1, 0].float() * rollout.response_mask.to(scores.device)


def split_critic_values(critic, rollout, shards):
    """:func:`critic_token_values` of a rollout every rank of a sequence group holds, its rows split over the
    group (:class:`trainer_lib.rl.rollout.SplitRows`)."""
    from trainer_lib.rl.rollout import SplitRows

    rows = SplitRows(rollout, shards, next(critic.parameters()).device)
    return rows.back_in_place(_head_outputs(critic, rows.inputs)[..., 0].float())


def _head_outputs(critic, inputs: dict):
    """The critic's ``score`` head outputs ``(B, T, 1)`` at every position of ``inputs``."""
    outputs = []
    head = next(m for name, m in critic.named_modules() if name.rsplit(".", 1)[-1] == "score")
    hook = head.register_forward_hook(lambda module, args, out: outputs.append(out))
    try:
        critic(**inputs, use_cache=False)
    finally:
        hook.remove()
    return outputs[-1]
