"""Errors that are the user's to fix: the CLI prints them without a traceback and exits 2."""


class UserError(Exception):
    """Bad input (data, paths, settings) found after the config itself validated."""


class ConfigError(UserError):
    """A config value is unknown, of the wrong type or impossible. Exit code 2."""


class DataError(UserError):
    """A dataset row is malformed. The message names file, line, field and what was expected."""

    def __init__(self, location: str, field: str | None, expected: str, got: object = None):
        self.location, self.field, self.expected, self.got = location, field, expected, got
        where = f"field '{field}': " if field else ""
        got_text = "" if got is None and field is None else f", got {_describe(got)}"
        super().__init__(f"{location}: {where}expected {expected}{got_text}")

    def __reduce__(self):  # rebuilt from its parts when it crosses a process (datasets.map workers)
        return type(self), (self.location, self.field, self.expected, self.got)


class NonFiniteLossError(UserError):
    """A training loss became NaN or inf: the run stops before saving that step (exit code 2)."""


def _describe(value: object) -> str:
    if value is None:
        return "null"
    text = repr(value)
    kind = type(value).__name__
    return f"{kind} {text[:60] + '...' if len(text) > 60 else text}"
