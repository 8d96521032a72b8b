"""The JSON parser, hardened: whatever the body, a malformed one is a 400 and never reaches a serializer or the
database in a shape that could fail there.

- Nesting is bounded (``MAX_JSON_DEPTH`` levels, the envelope included): a body nested deeply enough to
  exhaust the parser's recursion, or a serializer's, or the JSON encoder's on the way to the database, is refused.
- Text must be valid Unicode: JSON's ``\\ud800`` escape decodes to a lone surrogate, which UTF-8 cannot encode —
  PostgreSQL would refuse it, and an error message echoing it could not be rendered. Refused in any key or string,
  at any depth, for every endpoint at once.
The walk is iterative, so checking a body cannot overflow the stack either.
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_JSON_DEPTH = 128


def check_json_body(value: Any) -> None:
    """ParseError unless ``value`` nests at most MAX_JSON_DEPTH levels and all its text is valid Unicode."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ParseError(
            "JSON parse error - text must be valid Unicode (a lone surrogate such as \\ud800 is not)"
        ) from None


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels") from None
        check_json_body(data)
        return data
