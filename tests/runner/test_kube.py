"""The API connection: a given host is used as is; a pod's namespace comes from its ServiceAccount mount."""

from tests.http_helpers import serving
from trainer_lib.runner import kube


class Version:
    def handle(self, request):
        return 200, {
            "major": "1",
            "minor": "33",
            "gitVersion": "v1.33.0",
            "gitCommit": "abc",
            "gitTreeState": "clean",
            "buildDate": "2026-05-01T00:00:00Z",
            "goVersion": "go1.24",
            "compiler": "gc",
            "platform": "linux/amd64",
        }


def test_api_client_talks_to_the_given_host():
    from kubernetes.client import VersionApi

    with serving(Version()) as server:
        client = kube.api_client(server.url)
        try:
            assert VersionApi(client).get_code().git_version == "v1.33.0"
        finally:
            client.close()
    assert [r.path for r in server.requests] == ["/version/"]


def test_current_namespace_is_the_pods_own(tmp_path, monkeypatch):
    (tmp_path / "namespace").write_text("team-a\n")
    monkeypatch.setattr(kube, "NAMESPACE_FILE", str(tmp_path / "namespace"))
    assert kube.current_namespace() == "team-a"
