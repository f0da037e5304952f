"""Connecting to the Kubernetes API: in a pod with its ServiceAccount, elsewhere through kubeconfig.

The ``kubernetes`` package is imported inside the functions: importing this module costs nothing.
"""

from __future__ import annotations

import os

NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def api_client(host: str | None = None):
    """A ``kubernetes`` ApiClient: for ``host`` as given (tests, ``kubectl proxy``), else in-cluster
    (the pod's ServiceAccount token), else the current kubeconfig context."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if host:
        configuration.host = host
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            # $KUBECONFIG read now, not when the kubernetes package was imported
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    return client.ApiClient(configuration)


def current_namespace() -> str:
    """The pod's own namespace (where its ServiceAccount was granted rights), else kubeconfig's, else default."""
    if os.path.isfile(NAMESPACE_FILE):
        with open(NAMESPACE_FILE, encoding="utf-8") as fh:
            return fh.read().strip()
    try:
        from kubernetes import config

        contexts = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG"))
        return contexts[1]["context"].get("namespace") or "default"
    except Exception:  # no kubeconfig, or no current context
        return "default"
