"""Reading request bodies field by field, for both servers.

``Fields`` wraps one map of a decoded request (msgpack or JSON). Every
problem raises ``InvalidRequestError`` naming the field's path
(``topics[2].configs``) and what was expected, so a caller with a wrong
type learns exactly what to fix. Unknown fields are ignored, for newer
clients; an absent field and a null one are the same.
"""

from __future__ import annotations

from typing import Any

from protocol.errors import InvalidRequestError

REQUIRED = object()



def printable(value: Any) -> str:
    """A short rendering of any request value for an error message. Never
    raises: Python refuses to print integers of more than 4300 digits, and a
    request may carry one."""
    if isinstance(value, (list, tuple, dict)):
        return f"a {'map' if isinstance(value, dict) else 'list'} of {len(value)} items"
    if isinstance(value, int) and not isinstance(value, bool) and not -10**18 < value < 10**18:
        return "an integer of 19 or more digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

class Fields:
    """One map of a request, read field by field. Every problem raises
    ``InvalidRequestError`` naming the field path (``topics[2].configs``)
    and what is expected. Unknown fields are ignored, for newer clients.
    An absent field and a null one are the same."""

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise InvalidRequestError(
                f"{where or 'the request body'} must be a map, got {printable(value)}")
        self.values = value
        self.where = where

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def required(self, key: str) -> Any:
        """A field of any type that must be present; the caller checks it."""
        return self._get(key, REQUIRED)[0]

    def _get(self, key: str, default: Any) -> tuple[Any, bool]:
        """(value, present); raises if absent and required."""
        value = self.values.get(key)
        if value is None:
            if default is REQUIRED:
                raise InvalidRequestError(f"{self.path(key)} is required")
            return default, False
        return value, True

    # integer() and string() take the common case (an int or str in range)
    # without building the field's path, which only an error message needs:
    # a fetch or produce request names thousands of partitions.
    def integer(self, key: str, minimum: int, maximum: int, default: Any = REQUIRED) -> Any:
        value = self.values.get(key)
        if value.__class__ is int and minimum <= value <= maximum:
            return value
        if value is None:
            return self._get(key, default)[0]
        return as_int(value, self.path(key), minimum, maximum)

    def string(self, key: str, max_chars: int, min_chars: int = 1,
               default: Any = REQUIRED) -> Any:
        value = self.values.get(key)
        if value.__class__ is str and min_chars <= len(value) <= max_chars:
            return value
        if value is None:
            return self._get(key, default)[0]
        return as_str(value, self.path(key), max_chars, min_chars)

    def boolean(self, key: str, default: Any = REQUIRED) -> Any:
        value, present = self._get(key, default)
        if present and not isinstance(value, bool):
            raise InvalidRequestError(
                f"{self.path(key)} must be true or false, got {printable(value)}")
        return value

    def sequence(self, key: str, max_items: int, default: Any = REQUIRED) -> Any:
        return self._container(key, list, "a list", "items", max_items, default)

    def strings(self, key: str, max_items: int, max_chars: int, default: Any = REQUIRED) -> Any:
        """A list of strings (for example topic names)."""
        values = self.sequence(key, max_items, default)
        if values is default:
            return values
        return [as_str(value, f"{self.path(key)}[{i}]", max_chars)
                for i, value in enumerate(values)]

    def mapping(self, key: str, max_items: int, default: Any = REQUIRED) -> Any:
        return self._container(key, dict, "a map", "entries", max_items, default)

    def _container(self, key: str, kind: type, kind_name: str, unit: str, max_items: int,
                   default: Any) -> Any:
        value, present = self._get(key, default)
        if present and not isinstance(value, kind):
            raise InvalidRequestError(
                f"{self.path(key)} must be {kind_name}, got {printable(value)}")
        if present and len(value) > max_items:
            raise InvalidRequestError(
                f"{self.path(key)} has {len(value)} {unit}; the limit is {max_items}")
        return value

def as_int(value: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InvalidRequestError(
            f"{where} must be an integer from {minimum} to {maximum}, got {printable(value)}")
    return value


def as_str(value: Any, where: str, max_chars: int, min_chars: int = 1) -> str:
    if not isinstance(value, str) or not min_chars <= len(value) <= max_chars:
        raise InvalidRequestError(
            f"{where} must be a string of {min_chars} to {max_chars} characters, "
            f"got {printable(value)}")
    return value
