"""Rewards for the RL stages: functions (built-in and ``module:function``), a reward model
scorer, and how several sources combine into one scalar per completion.

    functions.py   built-ins (code_execution, code_style, code_ast, length_penalty, refusal, think_format_reward,
                   accuracy_reward, reasoning_accuracy_reward), user-function loading
    math_answer.py the accuracy rewards: a final math answer checked against the solution column
    syntax_tree.py the code_ast built-in: syntax, entry point and arity, forbidden names, by the syntax tree
    refusal_rules.py  whether a response reads as a refusal (the refusal reward and the evaluation's judge)
    model.py       a trained reward model as a reward function (normalized by its stored stats)
    clip.py        a CLIP-like dual encoder scoring a completion against its prompt's images
    llm_judge.py   an LLM as judge: rubric prompt, strict score parser, cache, local causal-LM backend;
                   a reward source of the RL stages through reward.judge.* (build_judge)
    judge_endpoint.py  the judge's OpenAI-compatible HTTP backend (timeouts, retries, the key kept secret)
    prm_scorer.py  a process reward model's step scores, aggregated (min, last, mean) into one reward
    combine.py     weights, clipping, batch/running normalization

Nothing is imported here, so importing the package stays cheap.
"""
