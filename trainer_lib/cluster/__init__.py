"""Running stages on a Kubernetes cluster beyond the KFP task's own pod.

* :mod:`~trainer_lib.cluster.trainjob`: launch a training stage on several nodes as a Kubeflow
  Trainer v2 ``TrainJob``, wait for it and clean it up (what a KFP launcher task calls).
* :mod:`~trainer_lib.cluster.kube`: the API connection (in-cluster, kubeconfig, or a given host).

Nothing is imported here: the ``kubernetes`` client is loaded only when a job is launched.
"""
