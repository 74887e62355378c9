"""Argument checks shared by the callbacks."""


def check_interval(interval, what):
    """Raises a ``ValueError`` naming a bad ``interval`` (steps between ``what``) and the fix."""
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise ValueError(
            f"interval={interval!r} is not valid; use a positive int, the number "
            f"of training steps between {what} (e.g. 10)"
        )
