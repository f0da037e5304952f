"""An OpenAI-compatible chat endpoint (``POST {url}/chat/completions``) as the backend of an LLM judge.

Each rendered judge prompt is one request (one user message, temperature 0 by default); a batch goes out
over ``concurrency`` threads. Each try waits at most ``timeout_s``; a try that times out, cannot connect,
or is answered 408, 429 or 5xx is retried, ``tries`` in all, after ``backoff_s * 2**k`` seconds. Another
4xx is final. An answer that is not a chat completion (``choices[0].message.content`` a string) is a
failure too, not retried. A failed request gives None for that prompt (the judge counts it and uses its
default) and one warning line; nothing raises for the endpoint's sake.

The API key is read once, from the file ``api_key_file`` (a mounted Kubernetes Secret) or else the
environment variable ``api_key_env``, and sent as ``Authorization: Bearer``. It is kept in a private
attribute and appears in no log line, warning, exception, ``repr`` or count: messages name the endpoint
by scheme and host only and pass through :func:`trainer_lib.storage.redact` with the key blanked.
Only the standard library's urllib is used (as the release notifications do): no new dependency.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request

from trainer_lib import storage
from trainer_lib.errors import UserError

log = logging.getLogger(__name__)

#: The environment variable the key is read from unless told otherwise.
API_KEY_ENV = "POSTTRAIN_JUDGE_API_KEY"
#: Most bytes of an answer read; a longer one is treated as garbage.
MAX_ANSWER_BYTES = 4 << 20
RETRY_STATUS = (408, 429)


def public(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: all of it a message may show (keys can live in queries)."""
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "?") + (f":{parts.port}" if parts.port else "")
    return f"{parts.scheme or '?'}://{host}"


def read_api_key(api_key_env: str = API_KEY_ENV, api_key_file: str = "") -> str:
    """The key from ``api_key_file`` when given (it must exist), else from ``api_key_env`` (empty when
    unset: an endpoint without authentication). Errors name the file or variable, never a value."""
    from trainer_lib.values import read_secret

    return read_secret("judge.api_key_file", api_key_file, api_key_env)


class ChatEndpoint:
    """``generate(texts) -> list[str | None]`` through an OpenAI-compatible chat endpoint.

    Args:
        url: the API base (``https://host/v1``) or the full ``.../chat/completions`` address.
        model: the ``model`` field of each request; also the judge's cache key.
        api_key_env, api_key_file: where the key is read (see :func:`read_api_key`).
        timeout_s: seconds one try may take (connect and answer).
        tries: tries per prompt (at least 1); backoff_s: the first pause between them, doubling.
        concurrency: requests in flight at once.
        max_tokens, temperature: the completion's length limit and sampling temperature.
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key_env: str = API_KEY_ENV,
        api_key_file: str = "",
        timeout_s: float = 30.0,
        tries: int = 3,
        backoff_s: float = 1.0,
        concurrency: int = 4,
        max_tokens: int = 512,
        temperature: float = 0.0,
    ):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(
                "judge.url: expected the http(s) URL of an OpenAI-compatible API (not shown: it may hold a key)"
            )
        path = parts.path.rstrip("/")
        if not path.endswith("/chat/completions"):
            url = urllib.parse.urlunsplit(parts._replace(path=path + "/chat/completions"))
        self.url = url
        self.model_name = model
        self._key = read_api_key(api_key_env, api_key_file)
        self.timeout_s, self.tries, self.backoff_s = timeout_s, max(1, tries), backoff_s
        self.concurrency = max(1, concurrency)
        self.max_tokens, self.temperature = max_tokens, temperature

    def __repr__(self) -> str:
        return f"ChatEndpoint({public(self.url)}, model={self.model_name!r})"

    def _clean(self, text: str) -> str:
        if self._key:
            text = text.replace(self._key, "***")
        return storage.redact(text.replace(self.url, public(self.url)))

    def _post(self, text: str) -> tuple[str | None, str]:
        """One prompt: ``(content, "")`` or ``(None, why)`` after at most ``tries`` tries."""
        body = {
            "model": self.model_name,
            "messages": [{"role": "user", "content": text}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        why = "not tried"
        for attempt in range(self.tries):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                    raw = answer.read(MAX_ANSWER_BYTES + 1)
            except urllib.error.HTTPError as exc:
                exc.close()
                why = f"HTTP {exc.code}"
                if exc.code < 500 and exc.code not in RETRY_STATUS:
                    break  # refused for good (bad key, bad request): a retry will not help
                continue
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # refused, timed out, cut
                reason = getattr(exc, "reason", None) or exc
                why = reason if isinstance(reason, str) else type(reason).__name__
                continue
            content = _content(raw)
            if content is None:
                return None, "the answer is not a chat completion (choices[0].message.content)"
            return content, ""
        return None, f"{why}; {self.tries} tries"

    def generate(self, texts: list[str]) -> list[str | None]:
        if not texts:
            return []
        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(texts))) as pool:
            results = list(pool.map(self._post, texts))
        failures = [why for _, why in results if why]
        if failures:
            log.warning(
                self._clean(
                    f"judge endpoint {public(self.url)}: {len(failures)} of {len(texts)} requests failed "
                    f"(first: {failures[0]}); they get the judge's default score"
                )
            )
        return [content for content, _ in results]


def _content(raw: bytes) -> str | None:
    """``choices[0].message.content`` of a chat completion, or None for anything else."""
    if len(raw) > MAX_ANSWER_BYTES:
        return None
    try:
        answer = json.loads(raw)
        content = answer["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return content if isinstance(content, str) else None
