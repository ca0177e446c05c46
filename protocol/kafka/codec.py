"""Kafka's binary encoding, driven by the generated schemas
(``protocol/kafka/messages.py``): a message version's fields become a plan
once (``plan``), and ``decode``/``encode`` walk it.

Messages are dicts keyed by the schema's field names (``"Topics"``,
``"PartitionIndex"``); a struct is a dict, an array a list. Encoding fills
a missing field with its schema default (Kafka's rule), so a handler
writes only what it knows. Flexible versions (KIP-482) use compact
lengths (unsigned varint of length + 1) and end every struct with tagged
fields; a tagged field is written only when it differs from its default.

Every read is bounds-checked: a short or malformed frame raises
``KafkaDecodeError``, never an IndexError or a huge allocation (a length
larger than what is left of the frame is refused before anything is made
of it).
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from protocol.kafka import messages

_INT8, _INT16, _INT32, _INT64 = (struct.Struct(f">{c}") for c in "bhiq")
_UINT16, _UINT32, _FLOAT64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">d")
_FIXED = {"int8": _INT8, "int16": _INT16, "int32": _INT32, "int64": _INT64,
          "uint16": _UINT16, "uint32": _UINT32, "float64": _FLOAT64}
ZERO_UUID = b"\0" * 16


class KafkaDecodeError(ValueError):
    """Bytes that are not the message they claim to be."""


# -- varints (unsigned, and zig-zag signed as in records) ----------------------
def write_uvarint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_uvarint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise KafkaDecodeError("a varint runs past the end of the frame")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise KafkaDecodeError("a varint longer than 10 bytes")


# -- plans -----------------------------------------------------------------------
class Field:
    __slots__ = ("name", "kind", "element", "nullable", "tag", "default", "sub", "flexible")

    def __init__(self, name, kind, element, nullable, tag, default, sub, flexible):
        self.name, self.kind, self.element = name, kind, element
        self.nullable, self.tag, self.default = nullable, tag, default
        self.sub, self.flexible = sub, flexible


class Plan:
    """The fields of one struct at one version: in order, then tagged."""

    __slots__ = ("fields", "tagged", "flexible", "by_tag")

    def __init__(self, fields: list[Field], tagged: list[Field], flexible: bool) -> None:
        self.fields, self.tagged, self.flexible = fields, tagged, flexible
        self.by_tag = {f.tag: f for f in tagged}


def _within(span: tuple[int, int] | None, version: int) -> bool:
    return span is not None and span[0] <= version <= span[1]


def _default(kind: str, text: Any, nullable: bool) -> Any:
    """A field's default: Kafka's definitions give it as a string ("-1",
    "0x7fffffff", "null", "true") or, now and then, a JSON number or bool."""
    if text is not None and not isinstance(text, str):
        text = str(text).lower()
    if text == "null" or (text is None and nullable and kind not in _FIXED):
        return None
    if kind.startswith("[]"):
        return []
    if kind in _FIXED:
        return (float(text) if kind == "float64" else int(text, 0)) if text else 0
    if kind == "bool":
        return text == "true"
    if kind == "string":
        return text or ""
    if kind in ("bytes", "records"):
        return b""
    if kind == "uuid":
        return ZERO_UUID
    return None  # a struct: made from its own defaults when written


def _plan(fields: tuple, version: int, flexible: bool) -> Plan:
    ordered, tagged = [], []
    for name, kind, span, nullable, tagged_span, tag, default, sub, override in fields:
        if not _within(span, version):
            continue
        field_flexible = flexible if override == "inherit" else _within(override, version)
        is_nullable = _within(nullable, version)
        element = kind[2:] if kind.startswith("[]") else kind
        sub_plan = _plan(sub, version, flexible) if sub is not None else None
        made = Field(name, kind, element, is_nullable, tag,
                     _default(kind, default, is_nullable), sub_plan, field_flexible)
        (tagged if _within(tagged_span, version) else ordered).append(made)
    return Plan(ordered, sorted(tagged, key=lambda f: f.tag), flexible)


_plans: dict[tuple[str, int], Plan] = {}


def plan(schema: dict, version: int) -> Plan:
    key = (schema["name"], version)
    found = _plans.get(key)
    if found is None:
        if not _within(schema["valid"], version):
            raise KafkaDecodeError(f"{schema['name']} has no version {version}")
        found = _plans[key] = _plan(schema["fields"], version,
                                    _within(schema["flexible"], version))
    return found


def is_flexible(schema: dict, version: int) -> bool:
    return _within(schema["flexible"], version)


# -- decoding ----------------------------------------------------------------------
#: Array elements one message may hold: a few bytes each would otherwise
#: become as many Python objects (and answers) as a frame has bytes.
ELEMENTS_MAX = 100_000


class Reader:
    __slots__ = ("data", "pos", "elements_left")

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data, self.pos = data, pos
        self.elements_left = ELEMENTS_MAX

    def take(self, size: int) -> memoryview | bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise KafkaDecodeError(f"a field of {size} bytes runs past the end of the frame")
        chunk = self.data[self.pos:end]
        self.pos = end
        return chunk

    def fixed(self, codec: struct.Struct) -> Any:
        end = self.pos + codec.size
        if end > len(self.data):
            raise KafkaDecodeError("the frame ends inside a field")
        (value,) = codec.unpack_from(self.data, self.pos)
        self.pos = end
        return value

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.data, self.pos)
        return value

    def length(self, flexible: bool, wide: bool) -> int:
        """A length or count: -1 for null."""
        if flexible:
            return self.uvarint() - 1
        return self.fixed(_INT32 if wide else _INT16)

    def skip_tagged(self) -> dict[int, bytes]:
        fields = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            fields[tag] = bytes(self.take(self.uvarint()))
        return fields


def _read_value(reader: Reader, field: Field, kind: str, flexible: bool) -> Any:
    codec = _FIXED.get(kind)
    if codec is not None:
        return reader.fixed(codec)
    if kind == "string":
        size = reader.length(flexible, wide=False)
        if size < 0:
            if size < -1 or not field.nullable:
                raise KafkaDecodeError(f"{field.name}: a null or negative string length")
            return None
        try:
            return bytes(reader.take(size)).decode()
        except UnicodeDecodeError:
            raise KafkaDecodeError(f"{field.name}: not UTF-8") from None
    if kind in ("bytes", "records"):
        size = reader.length(flexible, wide=True)
        if size < 0:
            if size < -1 or not (field.nullable or kind == "records"):
                raise KafkaDecodeError(f"{field.name}: a null or negative byte length")
            return None
        return bytes(reader.take(size))
    if kind == "bool":
        return reader.fixed(_INT8) != 0
    if kind == "uuid":
        return bytes(reader.take(16))
    if field.sub is not None:
        if field.nullable and kind == field.kind:
            # A nullable struct: a byte first, -1 for null, 1 for one.
            if reader.fixed(_INT8) < 0:
                return None
        return _read_struct(reader, field.sub)
    raise KafkaDecodeError(f"{field.name}: unknown type {kind}")


def _read_field(reader: Reader, field: Field) -> Any:
    flexible = field.flexible
    if field.kind.startswith("[]"):
        count = reader.length(flexible, wide=True)
        if count < 0:
            if count < -1 or not field.nullable:
                raise KafkaDecodeError(f"{field.name}: a null or negative array length")
            return None
        if count > len(reader.data) - reader.pos:  # every element takes a byte at least
            raise KafkaDecodeError(f"{field.name}: {count} elements in a shorter frame")
        reader.elements_left -= count
        if reader.elements_left < 0:
            raise KafkaDecodeError(f"more than {ELEMENTS_MAX} array elements in one message")
        return [_read_value(reader, field, field.element, flexible) for _ in range(count)]
    return _read_value(reader, field, field.kind, flexible)


def _read_struct(reader: Reader, plan_: Plan) -> dict:
    out = {f.name: _read_field(reader, f) for f in plan_.fields}
    for f in plan_.tagged:
        out[f.name] = f.default
    if plan_.flexible:
        for tag, raw in reader.skip_tagged().items():
            f = plan_.by_tag.get(tag)
            if f is not None:
                inner = Reader(raw)
                inner.elements_left = reader.elements_left
                out[f.name] = _read_field(inner, f)
                reader.elements_left = inner.elements_left
    return out


def decode(schema: dict, version: int, data: bytes | memoryview, pos: int = 0
           ) -> tuple[dict, int]:
    """The message at ``pos``, and where it ends."""
    reader = Reader(data, pos)
    return _read_struct(reader, plan(schema, version)), reader.pos


# -- encoding -------------------------------------------------------------------------
def _write_length(out: bytearray, size: int, flexible: bool, wide: bool) -> None:
    if flexible:
        write_uvarint(out, size + 1)
    else:
        out += (_INT32 if wide else _INT16).pack(size)


def _write_value(out: bytearray, field: Field, kind: str, value: Any, flexible: bool) -> None:
    codec = _FIXED.get(kind)
    if codec is not None:
        out += codec.pack(value)
    elif kind == "string":
        if value is None and not field.nullable:
            value = ""  # null is not this version's to say: the empty string
        if value is None:
            _write_length(out, -1, flexible, wide=False)
        else:
            raw = value.encode()
            _write_length(out, len(raw), flexible, wide=False)
            out += raw
    elif kind in ("bytes", "records"):
        if value is None and not field.nullable:
            value = b""
        if value is None:
            _write_length(out, -1, flexible, wide=True)
        else:
            _write_length(out, len(value), flexible, wide=True)
            out += value
    elif kind == "bool":
        out.append(1 if value else 0)
    elif kind == "uuid":
        out += value if isinstance(value, (bytes, bytearray)) else uuid.UUID(value).bytes
    elif field.sub is not None:
        if field.nullable and kind == field.kind:
            out.append(0xFF if value is None else 1)
            if value is None:
                return
        _write_struct(out, field.sub, value or {})
    else:
        raise ValueError(f"{field.name}: unknown type {kind}")


def _write_field(out: bytearray, field: Field, value: Any) -> None:
    flexible = field.flexible
    if field.kind.startswith("[]"):
        if value is None and not field.nullable:
            value = []
        if value is None:
            _write_length(out, -1, flexible, wide=True)
            return
        _write_length(out, len(value), flexible, wide=True)
        for item in value:
            _write_value(out, field, field.element, item, flexible)
        return
    _write_value(out, field, field.kind, value, flexible)


def _write_struct(out: bytearray, plan_: Plan, values: dict) -> None:
    for f in plan_.fields:
        _write_field(out, f, values.get(f.name, f.default))
    if plan_.flexible:
        present = [(f, values[f.name]) for f in plan_.tagged
                   if f.name in values and values[f.name] != f.default]
        write_uvarint(out, len(present))
        for f, value in present:
            inner = bytearray()
            _write_field(inner, f, value)
            write_uvarint(out, f.tag)
            write_uvarint(out, len(inner))
            out += inner


def encode(schema: dict, version: int, values: dict, out: bytearray | None = None
           ) -> bytearray:
    out = bytearray() if out is None else out
    _write_struct(out, plan(schema, version), values)
    return out


# -- headers ------------------------------------------------------------------------
def request_header_version(api_key: int, api_version: int) -> int:
    """2 for a flexible request version, else 1 (Kafka's rule)."""
    request = messages.APIS[api_key][0]
    return 2 if is_flexible(request, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """1 for a flexible response version, else 0; ApiVersions always 0
    (a client must read it before it knows the broker's versions)."""
    if api_key == 18:
        return 0
    response = messages.APIS[api_key][1]
    return 1 if is_flexible(response, api_version) else 0
