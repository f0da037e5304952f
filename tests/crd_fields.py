"""The fields the custom resources we emit may hold, copied from the upstream CRDs' OpenAPI schemas.

No cluster (and no network) at test time, so the schemas are hard-coded here: a dict lists the
allowed keys of an object and the schema of each, ``...`` means any value (not checked further).
Update them together with the pinned versions:

* ``TrainJob``: kubeflow/trainer v2.3.0 (2026-08), manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml.
  v2.2 has the same spec fields; v2.0/v2.1 had ``labels``/``annotations``/``podSpecOverrides``
  (``podTemplateOverrides``) instead of ``runtimePatches``/``activeDeadlineSeconds``.
* ``InferenceService`` v1beta1: kserve/kserve v0.20.0 (2026), config/crd/full/serving.kserve.io_inferenceservices.yaml.
"""

from __future__ import annotations

ANY = ...

TRAINJOB = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": ANY,
    "status": ANY,
    "spec": {
        "runtimeRef": {"name": ANY, "kind": ANY, "apiGroup": ANY},
        "trainer": {key: ANY for key in "image command args env numNodes numProcPerNode resourcesPerNode".split()},
        "initializer": ANY,
        "managedBy": ANY,
        "runtimePatches": ANY,
        "suspend": ANY,
        "activeDeadlineSeconds": ANY,
    },
}
#: TrainJob .metadata.name rules (x-kubernetes-validations of the CRD): RFC 1035 label, <= 63 characters
TRAINJOB_NAME = r"[a-z]([-a-z0-9]*[a-z0-9])?"

_PREDICTOR = """activeDeadlineSeconds affinity annotations autoScaling automountServiceAccountToken batcher
canaryTrafficPercent containerConcurrency containers deploymentStrategy dnsConfig dnsPolicy enableServiceLinks
hostAliases hostIPC hostNetwork hostPID hostUsers hostname hostnameOverride huggingface imagePullSecrets
initContainers labels lightgbm logger maxReplicas minReplicas model name nodeName nodeSelector onnx os overhead
paddle pmml preemptionPolicy priority priorityClassName pytorch readinessGates resourceClaims resources
restartPolicy runtimeClassName scaleMetric scaleMetricType scaleTarget schedulerName schedulingGates
securityContext serviceAccount serviceAccountName setHostnameAsFQDN shareProcessNamespace sklearn
storageContainerName storageUris subdomain tensorflow terminationGracePeriodSeconds timeout tolerations
topologySpreadConstraints triton volumes workerSpec xgboost""".split()
_MODEL = """args command confidential env envFrom image imagePullPolicy lifecycle livenessProbe modelFormat name ports
protocolVersion readinessProbe resizePolicy resources restartPolicy restartPolicyRules runtime runtimeVersion
securityContext startupProbe stdin stdinOnce storage storageUri terminationMessagePath terminationMessagePolicy tty
volumeDevices volumeMounts workingDir""".split()

INFERENCESERVICE = {
    "apiVersion": ANY,
    "kind": ANY,
    "metadata": ANY,
    "status": ANY,
    "spec": {
        "predictor": {
            **{key: ANY for key in _PREDICTOR},
            "model": {**{key: ANY for key in _MODEL}, "modelFormat": {"name": ANY, "version": ANY}},
        },
        "transformer": ANY,
        "explainer": ANY,
        "canary": ANY,
    },
}

#: the schema of each custom kind, by (apiVersion, kind)
CUSTOM = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): TRAINJOB,
    ("serving.kserve.io/v1beta1", "InferenceService"): INFERENCESERVICE,
}


def unknown_fields(obj, schema, path: str = "") -> list[str]:
    """The dotted paths in ``obj`` that ``schema`` does not allow (empty: every key is known)."""
    if schema is ANY or not isinstance(obj, dict):
        return []
    found = []
    for key, value in obj.items():
        where = f"{path}.{key}" if path else key
        if key not in schema:
            found.append(where)
        else:
            found += unknown_fields(value, schema[key], where)
    return found
