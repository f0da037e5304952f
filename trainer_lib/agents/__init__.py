"""Agents: multi-turn episodes in which the policy calls tools or acts in an environment.

- ``env.py``: the environment interface (``reset(row) -> Observation``, ``step(assistant_message) ->
  StepResult``), ``load_environment`` for ``env.class=module:Class`` with ``env.settings``, and an adapter
  for Gymnasium-style text environments.
- ``tools.py``: ``Tool`` (a name, a JSON schema, a function); schemas from typed, docstringed functions;
  the built-in ``calculator``, ``python`` (in the sandbox) and ``search`` (BM25) tools.
- ``tool_calls.py``: reading the model's tool calls (Hermes/Qwen ``<tool_call>`` tags, Llama 3 JSON) and
  checking them against the schemas; a tool result as a chat message.
- ``tool_env.py``: ``ToolEnvironment``, a question answered with tools, every call bounded in time and
  output, every failure a message for the model.
- ``episode.py``: ``run_episode`` for one episode, ``EpisodeBatch`` for many advanced a turn at a time by a
  rollout engine, and the discounted ``returns``.

It sits in the core beside ``loop/`` and ``rewards/``: it needs ``sandbox/`` and nothing of training, and
``rl/`` builds its multi-turn rollouts on it. Nothing here imports torch.
"""

from trainer_lib.agents.env import (
    ENV_CLASS_KEY,
    Environment,
    GymTextEnvironment,
    Observation,
    StepResult,
    load_environment,
)
from trainer_lib.agents.episode import (
    DONE_REASONS,
    Episode,
    EpisodeBatch,
    EpisodeResult,
    PendingTurn,
    Policy,
    ToolCallCounts,
    message_length,
    returns,
    run_episode,
)
from trainer_lib.agents.tool_calls import (
    MalformedCall,
    ParsedMessage,
    ToolCall,
    argument_problem,
    parse_tool_calls,
    schema_name,
    tool_message,
)
from trainer_lib.agents.tool_env import ERROR_KINDS, CallOutcome, ToolEnvironment
from trainer_lib.agents.tools import (
    Bm25Index,
    Refused,
    Tool,
    calculator,
    calculator_tool,
    evaluate_arithmetic,
    python_tool,
    read_corpus,
    search_tool,
    tool_from_function,
    tool_from_schema,
)

__all__ = [
    "DONE_REASONS",
    "ENV_CLASS_KEY",
    "ERROR_KINDS",
    "Bm25Index",
    "CallOutcome",
    "Environment",
    "Episode",
    "EpisodeBatch",
    "EpisodeResult",
    "GymTextEnvironment",
    "MalformedCall",
    "Observation",
    "ParsedMessage",
    "PendingTurn",
    "Policy",
    "Refused",
    "StepResult",
    "Tool",
    "ToolCall",
    "ToolCallCounts",
    "ToolEnvironment",
    "argument_problem",
    "calculator",
    "calculator_tool",
    "evaluate_arithmetic",
    "load_environment",
    "message_length",
    "parse_tool_calls",
    "python_tool",
    "read_corpus",
    "returns",
    "run_episode",
    "schema_name",
    "search_tool",
    "tool_from_function",
    "tool_from_schema",
    "tool_message",
]
