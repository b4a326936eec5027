"""What the relay role and its agent raise to their callers."""


class RelayUnavailable(Exception):
    """The relay could not be reached, or refused the node."""
