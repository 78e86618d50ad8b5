"""The one exception type the command line turns into a clean message and exit status 2."""


class LmsError(Exception):
    """A problem the user can act on: bad input, missing tool, patch that does not apply.

    `hint` is printed on its own line after the message: what to do next.
    """

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text}\n  hint: {self.hint}" if self.hint else text
