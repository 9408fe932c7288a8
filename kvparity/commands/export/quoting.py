"""How witness text enters a reproducer's source: as data, never as code.

A witness is a file anyone can hand you, and its strings (salts, request ids, titles, the check, the file
name) end up in a Python script that someone will run. Three rules keep them inert:

- `shown(value)`: a value written into prose (the docstring's story) is shown on one printable line —
  as is when it is printable ASCII without quotes or backslashes, else as its `ascii()` (quotes, backslashes, newlines, NUL, U+2028 and
  every other non-ASCII character escaped), so no value can start a line of its own (no `# -*- coding`
  line, no fake step) or smuggle a control character into the file;
- `docstring(text)`: the docstring literal is built from its intended value, with backslashes and every
  quote that could close it escaped, and checked by `ast.literal_eval` to read back as exactly that
  value: a `\"\"\"` in a title cannot end it and run what follows;
- `string_literal(text)`: the plan's JSON is written as a raw triple-quoted string when that reads back
  as the same text (readable, one number list a line), else as `repr()`. Either way the script sees the
  text only through `json.loads`.
"""

from __future__ import annotations

import ast
import re

_PLAIN = re.compile(r"[ !#-&(-\[\]-~]*")  # printable ASCII but the quotes and the backslash


def shown(value: object) -> str:
    """`value` for prose: plain text as is, anything else as its one-line, ASCII-only `ascii()`."""
    text = value if isinstance(value, str) else str(value)
    return text if _PLAIN.fullmatch(text) else ascii(text)


def _escape_char(ch: str) -> str:
    if ch == "\\":
        return "\\\\"
    if ch == "\n" or ch.isprintable():
        return ch
    return ascii(ch)[1:-1]  # \x00, \u2028, \r: as escapes, never raw in the file


def docstring(text: str) -> str:
    """A `\"\"\"...\"\"\"` literal whose value is exactly `text` (ValueError if that cannot be proven)."""
    body = "".join('\\"' if ch == '"' and text[i + 1:i + 2] in ('"', "") else _escape_char(ch)
                   for i, ch in enumerate(text))  # a quote before a quote or at the end: no closing run
    literal = f'"""{body}"""'
    if ast.literal_eval(literal) != text:
        raise ValueError("the docstring does not read back as written")  # a bug here, never the witness's
    return literal


def string_literal(text: str) -> str:
    """A literal whose value is exactly `text`: raw triple-quoted on its own lines when that reads back
    the same, else `repr(text)`."""
    candidate = f"r'''\n{text}\n'''"
    try:
        if "\x00" not in text and ast.literal_eval(candidate) == f"\n{text}\n":
            return candidate
    except (SyntaxError, ValueError):
        pass
    return repr(text)
