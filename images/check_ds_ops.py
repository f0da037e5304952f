"""Fail unless DeepSpeed's C++/CUDA ops were compiled when it was installed, and load.

    python images/check_ds_ops.py CPU_ADAM SHM_COMM    these ops (named as in DS_BUILD_<NAME>) are
                                                       prebuilt for this accelerator and load
    python images/check_ds_ops.py --installed          every prebuilt op loads (the image's runtime
                                                       stage: no compiler there, so none could be built)

``make setup`` and both builds of images/Dockerfile run it. It is the gate because nothing else fails:
DeepSpeed's setup.py skips a requested op it finds incompatible (no nvcc, no torch in the build
environment) without an error, and ``ds_report`` exits 0 whatever it reports. An op that is not
prebuilt is compiled at first use instead (JIT), which needs a compiler the image does not have.
Loading is done with TORCH_EXTENSIONS_DIR pointed at an empty directory, which must stay empty.
"""

from __future__ import annotations

import os
import sys
import tempfile


def problems(wanted_vars: list[str] | None, jit_dir: str) -> tuple[list[str], list[str]]:
    """(what is wrong, the ops checked); ``wanted_vars`` None: every op installed."""
    os.environ["TORCH_EXTENSIONS_DIR"] = jit_dir  # where a JIT build would go
    try:
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import accelerator_name, installed_ops, version
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
    except ImportError as exc:
        return [f"deepspeed does not import: {exc}"], []

    by_var = {builder.BUILD_VAR.removeprefix("DS_BUILD_"): name for name, builder in ALL_OPS.items()}
    if wanted_vars is None:
        wanted = [name for name, on in installed_ops.items() if on]
        if not wanted:
            return [f"deepspeed {version} was installed without any prebuilt op"], []
    else:
        unknown = [var for var in wanted_vars if var not in by_var]
        if unknown:
            return [
                f"no op is built by DS_BUILD_{', DS_BUILD_'.join(unknown)} for the {get_accelerator()._name} "
                f"accelerator (these are: {', '.join(sorted(by_var))})"
            ], []
        wanted = [by_var[var] for var in wanted_vars]

    found: list[str] = []
    running = get_accelerator()._name
    if accelerator_name != running:  # DeepSpeed then ignores its prebuilt ops and JIT-builds them
        found.append(
            f"deepspeed {version} was built for the {accelerator_name!r} accelerator, this process runs "
            f"{running!r} (set DS_ACCELERATOR={accelerator_name} to check it here)"
        )
        return found, wanted
    for name in wanted:
        builder = ALL_OPS[name]
        if not installed_ops.get(name):
            found.append(
                f"{name}: not prebuilt (install deepspeed with {builder.BUILD_VAR}=1 and --no-build-isolation; "
                f"can be built here: {builder.is_compatible()})"
            )
            continue
        try:
            builder.load()
        except Exception as exc:  # a missing shared library, an undefined symbol, a JIT attempt
            found.append(f"{name}: prebuilt but does not load: {' '.join(str(exc).split())[:500]}")
    if os.listdir(jit_dir):
        found.append(f"something was JIT-compiled into TORCH_EXTENSIONS_DIR: {sorted(os.listdir(jit_dir))}")
    return found, wanted


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="check-ds-ops-") as jit_dir:
        found, checked = problems(None if argv == ["--installed"] else argv, jit_dir)
    for line in found:
        print(f"check_ds_ops: {line}", file=sys.stderr)
    if not found:
        print(f"check_ds_ops: prebuilt and loaded: {', '.join(checked)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
