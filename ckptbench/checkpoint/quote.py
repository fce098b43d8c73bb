"""How a message quotes a value taken from a checkpoint: bounded whatever the value is.

`str(value)[:60]` first builds the whole text: a name 5000 tuples deep raised RecursionError (a traceback, not a
line), a 50 MB key made a 50 MB line, and a 5000-digit int raises ValueError in Python 3.11+.
"""

from __future__ import annotations

_SMALL = frozenset((bool, float, type(None)))


def quote(value, limit: int = 200) -> str:  # a path of 150 characters is common; 5 MB is not
    """`value`'s repr cut at `limit` characters where it is a string, bytes, a number or a short tuple of numbers (a
    shape, offsets); otherwise its type (and length) in angle brackets. Control characters come out escaped (repr)."""
    if isinstance(value, (str, bytes)):
        text = repr(value[:limit])
    elif type(value) in _SMALL or (type(value) is int and value.bit_length() <= 256):
        text = repr(value)
    elif type(value) in (tuple, list) and len(value) <= 16 and all(
            type(v) in _SMALL or (type(v) is int and v.bit_length() <= 256) for v in value):
        text = repr(value)
    elif type(value) is int:  # past any size or offset: its length says what is wrong with it ("<a int>" did not)
        return f"<an int of about {int(abs(value).bit_length() * 0.30103) + 1} digits>"
    elif isinstance(value, (tuple, list, dict)):
        return f"<a {type(value).__name__} of {len(value)}>"
    else:
        return f"<a {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 1] + "…"
