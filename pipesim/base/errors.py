"""The one error type users see.

A `UserError` is bad input: the CLI prints its message as one line on stderr and
exits with code 2. Anything else that escapes is an internal bug and keeps its
traceback.
"""


class UserError(ValueError):
    """Bad input from a user: one line naming the bad value and what is allowed."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def require(condition: bool, message: str) -> None:
    """Raise `UserError(message)` unless `condition` holds."""
    if not condition:
        raise UserError(message)
