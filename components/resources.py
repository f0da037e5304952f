"""training-resources: the CPU, memory and accelerator count of a run's training pods, from ``gpus_per_step``.

KFP sets a task's resources from a pipeline parameter or a task output as it is: no arithmetic, and only
from text (its driver reads a number-typed value as empty, so an integer parameter would request no
accelerator at all). This light task multiplies the per-GPU host resources of pipelines/settings.py by the
run's accelerator count and hands every training task of the run the strings Kubernetes reads
(``pipelines.settings.configure``).
"""

from typing import NamedTuple

from kfp import dsl

from components.common import image_for


@dsl.component(base_image=image_for("training-resources"), install_kfp_package=False)
def training_resources(gpus: int, nodes: int, cpu_per_gpu: int, memory_gi_per_gpu: int) -> NamedTuple(
    "Outputs", cpu=str, memory=str, accelerators=str
):
    """A training pod's CPU and memory (``cpu_per_gpu`` and ``memory_gi_per_gpu`` GiB for each of its ``gpus``
    accelerators, at least one GPU's worth) and its accelerator count, as Kubernetes quantities.

    With ``nodes`` > 1 the pod only launches and watches a TrainJob, whose nodes hold the accelerators
    (components.common.run_on_nodes): it gets none, and one GPU's worth of host resources.
    """
    from collections import namedtuple

    from components.common import HostPerGpu

    launcher = nodes > 1
    host = HostPerGpu(cpu=cpu_per_gpu, memory_gi=memory_gi_per_gpu).for_gpus(1 if launcher else gpus)
    outputs = namedtuple("Outputs", "cpu memory accelerators")
    return outputs(host["cpu"], host["memory"], str(0 if launcher else max(gpus, 0)))


@dsl.component(base_image=image_for("export-resources"), install_kfp_package=False)
def export_resources(parameters: int, cpu: int, memory_gi_min: int, bytes_per_parameter: float) -> NamedTuple(
    "Outputs", cpu=str, memory=str
):
    """The export pod's CPU and memory for a model of ``parameters`` parameters: ``bytes_per_parameter`` of
    host memory each (the export's measured peak per parameter, with room: docs/export-and-serving.md), and
    never under ``memory_gi_min`` GiB, which is also what a model of unknown size (0) gets."""
    import math
    from collections import namedtuple

    memory_gi = max(memory_gi_min, math.ceil(parameters * bytes_per_parameter / 2**30))
    return namedtuple("Outputs", "cpu memory")(str(cpu), f"{memory_gi}Gi")
