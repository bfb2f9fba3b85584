"""The one error type users see.

Every check on user input (a config field, a CLI flag, a trace file, a parameter) raises
:class:`M3LabError` with a one-line message that names the field and says how to fix it.
The CLI prints the message (no traceback) and exits with status 2.
"""


class M3LabError(ValueError):
    """Bad input: the message names the field and the fix, in one line."""

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None):
        self.field = field
        self.hint = hint
        text = message
        if hint:
            text = f"{text} ({hint})"
        super().__init__(text)
