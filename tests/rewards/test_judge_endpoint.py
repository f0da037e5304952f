"""The judge's OpenAI-compatible HTTP backend against a real local server (tests/http_helpers.py): answers,
a 500 then success, a hang, garbage, a refusal; the planted API key never reaches a log, a message, a
repr or the judge's counts."""

import logging
import threading
import time

import pytest

from tests.http_helpers import serving
from trainer_lib.errors import UserError
from trainer_lib.rewards.judge_endpoint import ChatEndpoint
from trainer_lib.rewards.llm_judge import LLMJudge

KEY = "sk-CANARY-0123456789abcdef"
ENV = "POSTTRAIN_TEST_JUDGE_KEY"


def completion(content):
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
    }


class Judge:
    """An endpoint that grades by the answer's length, after ``failures`` 500s per prompt; ``reply`` overrides."""

    def __init__(self, failures=0, status=200, reply=None, hang=False):
        self.failures, self.status, self.reply, self.hang = failures, status, reply, hang
        self.seen: dict[str, int] = {}
        self.lock, self.release = threading.Lock(), threading.Event()

    def handle(self, request):
        if self.hang:
            self.release.wait(30)
        text = request.json()["messages"][0]["content"]
        with self.lock:
            self.seen[text] = self.seen.get(text, 0) + 1
            if self.seen[text] <= self.failures:
                return 500, {"error": "busy"}
        if self.status != 200 or self.reply is not None:
            return self.status, self.reply
        answer = text.split("[Answer]\n", 1)[1].split("\n\n", 1)[0]
        return 200, completion(f"Graded by length.\nScore: {min(len(answer), 10)}")


def no_canary(caplog, capsys, *texts):
    out = capsys.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for text in (out.out, out.err, logged, *map(str, texts)):
        assert "CANARY" not in text


@pytest.fixture
def planted_key(monkeypatch, caplog):
    monkeypatch.setenv(ENV, KEY)
    caplog.set_level(logging.DEBUG)
    return KEY


def test_requests_carry_the_key_and_the_rubric_and_verdicts_become_rewards(planted_key, caplog, capsys):
    with serving(Judge()) as server:
        endpoint = ChatEndpoint(f"{server.url}/v1", "judge-model", api_key_env=ENV, concurrency=2)
        judge = LLMJudge(endpoint)
        rewards = judge(["Say hi.", "Count to three."], ["hi", "one two three"])
    assert rewards == pytest.approx([(2 - 1) / 9, (10 - 1) / 9])
    assert len(server.requests) == 2
    request = server.requests[0]
    assert request.path == "/v1/chat/completions" and request.headers["authorization"] == f"Bearer {KEY}"
    body = request.json()
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["messages"][0]["role"] == "user"
    assert "[Request]" in body["messages"][0]["content"]
    no_canary(caplog, capsys, repr(endpoint), judge.counts, vars(judge))


def test_the_key_can_come_from_a_mounted_secret_file(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    secret = tmp_path / "api-key"
    secret.write_text(KEY + "\n")
    with serving(Judge()) as server:
        endpoint = ChatEndpoint(f"{server.url}/v1/chat/completions", "m", api_key_env=ENV, api_key_file=str(secret))
        assert endpoint.generate(["[Answer]\nabc\n\n"]) == ["Graded by length.\nScore: 3"]
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    with serving(Judge()) as server:  # no key anywhere: no Authorization header
        ChatEndpoint(server.url, "m", api_key_env=ENV).generate(["[Answer]\nabc\n\n"])
    assert "authorization" not in server.requests[0].headers and server.requests[0].path == "/chat/completions"


def test_a_500_then_success_is_retried(planted_key, caplog, capsys):
    with serving(Judge(failures=1)) as server:
        judge = LLMJudge(ChatEndpoint(server.url + "/v1", "m", api_key_env=ENV, tries=3, backoff_s=0.01))
        assert judge(["p"], ["abcd"]) == pytest.approx([3 / 9])
    assert len(server.requests) == 2 and judge.counts["request_failures"] == 0
    no_canary(caplog, capsys)


def test_a_server_that_keeps_failing_is_tried_a_bounded_number_of_times(planted_key, caplog, capsys):
    with serving(Judge(failures=99)) as server:
        judge = LLMJudge(ChatEndpoint(server.url + "/v1", "m", api_key_env=ENV, tries=3, backoff_s=0.01), default=0.5)
        assert judge(["p"], ["abcd"]) == [0.5]
    assert len(server.requests) == 3 and judge.counts["request_failures"] == 1
    assert "HTTP 500; 3 tries" in caplog.text
    with serving(Judge(status=401, reply={"error": f"bad key {KEY}"})) as server:  # refused for good: one try
        endpoint = ChatEndpoint(server.url + "/v1", "m", api_key_env=ENV, tries=3, backoff_s=0.01)
        assert endpoint.generate(["x"]) == [None]
    assert len(server.requests) == 1 and "HTTP 401" in caplog.text
    no_canary(caplog, capsys)


@pytest.mark.serial  # timed against a wall-clock bound: run alone
def test_a_hanging_server_is_given_up_within_the_bound(planted_key, caplog, capsys):
    app = Judge(hang=True)
    with serving(app) as server:
        endpoint = ChatEndpoint(server.url + "/v1", "m", api_key_env=ENV, timeout_s=0.3, tries=2, backoff_s=0.05)
        judge = LLMJudge(endpoint, default=None)
        started = time.monotonic()
        rewards = judge(["p"], ["c"])
        took = time.monotonic() - started
        app.release.set()
    assert rewards == [None] and judge.counts["request_failures"] == 1
    assert took < 0.3 * 2 + 0.05 + 1.5  # two timeouts, one backoff, slack
    assert "TimeoutError; 2 tries" in caplog.text
    no_canary(caplog, capsys)


@pytest.mark.parametrize(
    "reply",
    [
        "not a chat completion",
        {"choices": []},
        {"choices": [{"message": {"content": 7}}]},
        {"result": "Score: 9"},
        [1, 2],
    ],
)
def test_garbage_answers_are_request_failures_with_the_default(planted_key, caplog, capsys, reply):
    with serving(Judge(reply=reply)) as server:
        judge = LLMJudge(ChatEndpoint(server.url + "/v1", "m", api_key_env=ENV, backoff_s=0.01), default=0.1)
        assert judge(["p"], ["c"]) == [0.1]
    assert judge.counts["request_failures"] == 1 and len(server.requests) == 1  # not retried
    assert "not a chat completion" in caplog.text
    no_canary(caplog, capsys)


def test_a_megabyte_verdict_is_a_parse_failure(planted_key):
    with serving(Judge(reply=completion("y" * 1_000_000 + "\nScore: 5"))) as server:
        judge = LLMJudge(ChatEndpoint(server.url + "/v1", "m", api_key_env=ENV))
        assert judge(["p"], ["c"]) == [0.0]
    assert judge.counts["parse_failures/too_long"] == 1 and judge.counts["request_failures"] == 0


def test_bad_settings_and_a_closed_port_never_show_the_key(planted_key, tmp_path, caplog, capsys):
    with pytest.raises(UserError) as bad_url:
        ChatEndpoint(f"ftp://judge.example/v1?key={KEY}", "m", api_key_env=ENV)
    with pytest.raises(UserError) as missing:
        ChatEndpoint("https://judge.example/v1", "m", api_key_file=str(tmp_path / "absent"))
    assert "absent" in str(missing.value)
    with serving(Judge()) as server:
        url = server.url
    endpoint = ChatEndpoint(f"{url}/v1?token={KEY}", "m", api_key_env=ENV, timeout_s=1, tries=2, backoff_s=0.01)
    assert endpoint.generate(["x"]) == [None]
    assert "ConnectionRefusedError; 2 tries" in caplog.text
    no_canary(caplog, capsys, bad_url.value, missing.value, repr(endpoint))
