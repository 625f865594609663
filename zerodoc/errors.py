"""Errors that reach a user as one clear line, never a traceback."""


class UserError(Exception):
    """Bad input (flags, paths, targets, files): the CLI prints the message and exits 2."""
