"""One exception type for problems a user can fix; the CLI prints it as a single line."""


class HyflashError(Exception):
    """Bad input or a bad file: the message names the problem and the fix."""
