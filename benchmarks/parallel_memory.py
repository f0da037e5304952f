"""The model states' memory per GPU for Llama 3.1 8B, 70B and 405B under tensor, pipeline and ZeRO choices.

    python -m benchmarks.parallel_memory [--json OUT]

Estimates, not measurements: :func:`trainer_lib.engine.deepspeed_file.states_estimate`, the line every
training stage prints at start, runs DeepSpeed's own estimators (bf16 weights and gradients, fp32 Adam
states) on ``1 / (T x P)`` of the parameters with ZeRO over the data-parallel ranks. Activations,
the CUDA context and fragmentation come on top. Prints the markdown table in docs/parallelism.md.
"""

from __future__ import annotations

import argparse
import json

from trainer_lib.config.sections import ParallelConfig
from trainer_lib.engine.deepspeed_file import size, states_estimate
from trainer_lib.engine.parallel import layout

GPUS_PER_NODE = 8
#: (name, parameters, largest layer: the 128,256-row embedding) from the models' config.json and index
MODELS = [
    ("Llama-3.1-8B", 8_030_261_248, 128_256 * 4_096),
    ("Llama-3.1-70B", 70_553_706_496, 128_256 * 8_192),
    ("Llama-3.1-405B", 405_853_388_800, 128_256 * 16_384),
]
#: (model, nodes, tensor, pipeline, ZeRO stage, offload optimizer, offload parameters)
LAYOUTS = [
    ("Llama-3.1-8B", 1, 1, 1, 2, False, False),
    ("Llama-3.1-8B", 1, 1, 1, 3, False, False),
    ("Llama-3.1-8B", 1, 2, 1, 1, False, False),
    ("Llama-3.1-8B", 1, 1, 2, 1, False, False),
    ("Llama-3.1-70B", 2, 1, 1, 3, False, False),
    ("Llama-3.1-70B", 2, 1, 1, 3, True, True),
    ("Llama-3.1-70B", 2, 8, 1, 1, False, False),
    ("Llama-3.1-70B", 2, 8, 1, 2, True, False),
    ("Llama-3.1-70B", 2, 8, 1, 3, False, False),
    ("Llama-3.1-70B", 2, 8, 1, 3, True, False),
    ("Llama-3.1-70B", 2, 1, 2, 1, False, False),
    ("Llama-3.1-70B", 2, 8, 2, 1, False, False),
    ("Llama-3.1-70B", 2, 8, 2, 1, True, False),
    ("Llama-3.1-405B", 4, 1, 1, 3, False, False),
    ("Llama-3.1-405B", 4, 8, 1, 3, False, False),
    ("Llama-3.1-405B", 4, 8, 4, 1, False, False),
    ("Llama-3.1-405B", 8, 8, 1, 3, True, False),
]


def rows() -> list[dict]:
    params = {name: (total, largest) for name, total, largest in MODELS}
    out = []
    for name, nodes, tensor, pipeline, stage, offload_optimizer, offload_params in LAYOUTS:
        world = nodes * GPUS_PER_NODE
        found = layout(ParallelConfig(tensor=tensor, pipeline=pipeline), world)
        cpu, gpu, _ = states_estimate(
            *params[name], stage, offload_optimizer, offload_params, world, GPUS_PER_NODE, found
        )
        offload = " + ".join(what for what, on in (("optimizer", offload_optimizer), ("params", offload_params)) if on)
        out.append(
            dict(model=name, nodes=nodes, gpus=world, tensor=tensor, pipeline=pipeline, data=found.data,
                 zero=stage, offload=offload, gpu_bytes=gpu, cpu_bytes_per_node=cpu)
        )  # fmt: skip
    return out


def markdown(table: list[dict]) -> str:
    lines = [
        "| model | GPUs (nodes x 8) | T | P | data | ZeRO | offload | states per GPU | CPU per node |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['model']} | {r['gpus']} ({r['nodes']} x 8) | {r['tensor']} | {r['pipeline']} | {r['data']} | "
            f"{r['zero']} | {r['offload'] or '-'} | {size(r['gpu_bytes'])} | {size(r['cpu_bytes_per_node'])} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    table = rows()
    print(markdown(table))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(table, fh, indent=2)


if __name__ == "__main__":
    main()
