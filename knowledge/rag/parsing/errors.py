class ParseError(ValueError):
    """A refused file; the message is shown to the user as is."""
