"""The one error type users see, and the one warning.

A `UserError` is bad input: the CLI prints its message as one line on stderr and
exits with code 2. Anything else that escapes is an internal bug and keeps its
traceback. A `PipesimWarning` is a caveat of an answer that is still given (a
borrowed profile, say): raised through `warnings`, so that Python code decides what to
do with it, and printed by the CLI as one line.
"""


class UserError(ValueError):
    """Bad input from a user: one line naming the bad value and what is allowed."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def require(condition: object, message: str) -> None:
    """Raise `UserError(message)` unless `condition` holds (is truthy: a non-empty list
    of points, a found table, as callers pass)."""
    if not condition:
        raise UserError(message)


class PipesimWarning(UserWarning):
    """A caveat of an answer pipesim still gives; the CLI prints it as one line."""
