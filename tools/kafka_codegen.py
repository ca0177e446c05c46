"""Generate ``protocol/kafka/messages.py`` from Kafka's JSON message
definitions (``clients/src/main/resources/common/message/*.json`` in the
Kafka repository).

    python tools/kafka_codegen.py DIR            # DIR holds the JSON files
    python tools/kafka_codegen.py --git REPO     # read them from a Kafka git clone's HEAD

Only the schema is kept: each message's API key, valid and flexible
versions, and per field its name, type, versions, nullable and tagged
versions, tag and default. The descriptions are dropped. The output is a
plain data module the codec (``protocol/kafka/codec.py``) interprets, so a
change of the definitions is a regenerate, never an edit by hand; the test
``tests/unit/test_kafka_codec.py`` checks the output is what this script
makes of the files recorded in it (``SOURCE``).
"""

from __future__ import annotations

import argparse
import json
import os
import pprint
import re
import subprocess
import sys

#: The messages kraftlog's Kafka listener may speak (requests and responses).
MESSAGES = (
    "ApiVersions", "Metadata", "Produce", "Fetch", "ListOffsets", "FindCoordinator",
    "JoinGroup", "SyncGroup", "Heartbeat", "LeaveGroup", "OffsetCommit", "OffsetFetch",
    "ListGroups", "DescribeGroups", "CreateTopics", "DeleteTopics", "CreatePartitions",
    "DescribeConfigs", "DescribeCluster", "InitProducerId", "SaslHandshake",
    "SaslAuthenticate", "AddPartitionsToTxn", "AddOffsetsToTxn", "EndTxn", "TxnOffsetCommit",
    "ConsumerGroupHeartbeat", "AlterConfigs", "IncrementalAlterConfigs", "OffsetForLeaderEpoch",
)
HEADERS = ("RequestHeader", "ResponseHeader")
#: Data carried inside messages: the classic group protocol's member
#: metadata (JoinGroup) and assignment (SyncGroup), each prefixed by its
#: version as an int16.
DATA = ("ConsumerProtocolSubscription", "ConsumerProtocolAssignment")
MESSAGE_DIR = "clients/src/main/resources/common/message"
ERRORS_JAVA = "clients/src/main/java/org/apache/kafka/common/protocol/Errors.java"
#: A version range with no upper bound ("3+") ends here.
VERSION_MAX = 32767
OUTPUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "protocol", "kafka", "messages.py")


def strip_comments(text: str) -> str:
    """JSON with ``//`` line comments (outside strings) made plain JSON."""
    out = []
    for line in text.splitlines():
        in_string = escaped = False
        for i, char in enumerate(line):
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = not in_string
            elif not in_string and line.startswith("//", i):
                line = line[:i]
                break
        out.append(line)
    return "\n".join(out)


def versions(text: str | None) -> tuple[int, int] | None:
    """"0+", "3-5", "7", "none" (or absent) as (low, high) or None."""
    if text is None or text == "none":
        return None
    match = re.fullmatch(r"(\d+)(\+|-(\d+))?", text.strip())
    if match is None:
        raise ValueError(f"not a version range: {text!r}")
    low = int(match.group(1))
    if match.group(2) == "+":
        return low, VERSION_MAX
    return low, int(match.group(3)) if match.group(3) else low


def field(spec: dict, structs: dict[str, list[dict]], depth: int = 0) -> tuple:
    """A field as the codec reads it: (name, type, versions, nullable
    versions, tagged versions, tag, default, subfields, flexible override).
    ``structs``: every struct type of the message by name (its field specs),
    for a field that names a type defined elsewhere in the message."""
    kind = spec["type"]
    element = kind[2:] if kind.startswith("[]") else kind
    sub = None
    if "fields" in spec or element in structs:
        if depth > 16:
            raise ValueError(f"struct {element} nests too deep (a cycle?)")
        sub = tuple(field(f, structs, depth + 1)
                    for f in spec.get("fields", structs.get(element, ())))
    flexible = spec.get("flexibleVersions")
    return (spec["name"], kind, versions(spec.get("versions")),
            versions(spec.get("nullableVersions")), versions(spec.get("taggedVersions")),
            spec.get("tag"), spec.get("default"), sub,
            versions(flexible) if flexible is not None else "inherit")


def _struct_specs(fields: list[dict], found: dict[str, list[dict]]) -> None:
    """Every struct a message defines inline (a field with ``fields``), by
    type name: another field of the message may name the type alone."""
    for spec in fields:
        if "fields" in spec:
            kind = spec["type"]
            found.setdefault(kind[2:] if kind.startswith("[]") else kind, spec["fields"])
            _struct_specs(spec["fields"], found)


def message(spec: dict) -> dict:
    structs: dict[str, list[dict]] = {}
    for common in spec.get("commonStructs", ()):
        structs[common["name"]] = common["fields"]
        _struct_specs(common["fields"], structs)
    _struct_specs(spec["fields"], structs)
    return {"name": spec["name"], "api_key": spec.get("apiKey"),
            "valid": versions(spec["validVersions"]),
            "flexible": versions(spec["flexibleVersions"]),
            "fields": tuple(field(f, structs) for f in spec["fields"])}


def load(read, names) -> dict[str, dict]:
    loaded = {}
    for name in names:
        loaded[name] = message(json.loads(strip_comments(read(name + ".json"))))
    return loaded


def error_codes(java: str) -> dict[str, int]:
    """Kafka's error names and numbers, from the enum in Errors.java."""
    return {name: int(code) for name, code in
            re.findall(r"^\s+([A-Z_]+)\((-?\d+),", java, flags=re.MULTILINE)}


def render(loaded: dict[str, dict], source: str, errors: dict[str, int]) -> str:
    lines = [
        '"""Kafka message schemas, GENERATED by tools/kafka_codegen.py from Kafka\'s',
        'JSON message definitions: do not edit (regenerate). Field tuples:',
        '(name, type, versions, nullable versions, tagged versions, tag, default,',
        'subfields, flexible versions override or "inherit"); versions are',
        f'(low, high) with {VERSION_MAX} for "and later", or None."""',
        "",
        "# flake8: noqa",
        f"SOURCE = {source!r}",
        "",
    ]
    for name, spec in loaded.items():
        lines.append(f"{name} = {pprint.pformat(spec, width=100, sort_dicts=False)}")
        lines.append("")
    requests = [n for n in loaded if n.endswith("Request") and n not in (*HEADERS, *DATA)]
    lines.append("#: API key -> (request schema, response schema).")
    lines.append("APIS = {")
    for name in requests:
        base = name[:-len("Request")]
        lines.append(f"    {loaded[name]['api_key']}: ({name}, {base}Response),")
    lines.append("}")
    lines.append("")
    lines.append("#: Kafka's error codes by name (Errors.java).")
    lines.append(f"ERRORS = {pprint.pformat(errors, width=100, sort_dicts=False)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="a directory of the JSON definitions")
    parser.add_argument("--git", metavar="REPO", help="read them from this Kafka clone's HEAD")
    parser.add_argument("--errors", metavar="FILE", help="Kafka's Errors.java (with a "
                        "directory of definitions; --git reads it from the clone)")
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args(argv)
    names = [*HEADERS, *DATA,
             *(n + kind for n in MESSAGES for kind in ("Request", "Response"))]
    if args.git:
        commit = subprocess.run(["git", "-C", args.git, "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()

        def read(file_name: str) -> str:
            return subprocess.run(["git", "-C", args.git, "show",
                                   f"HEAD:{MESSAGE_DIR}/{file_name}"], check=True,
                                  capture_output=True, text=True).stdout
        source = f"apache/kafka@{commit}:{MESSAGE_DIR}"
        errors = error_codes(subprocess.run(["git", "-C", args.git, "show",
                                             f"HEAD:{ERRORS_JAVA}"], check=True,
                                            capture_output=True, text=True).stdout)
    elif args.source:
        def read(file_name: str) -> str:
            with open(os.path.join(args.source, file_name)) as f:
                return f.read()
        source = args.source
        if not args.errors:
            parser.error("with a directory, give --errors Errors.java too")
        with open(args.errors) as f:
            errors = error_codes(f.read())
    else:
        parser.error("give a directory of the JSON definitions or --git REPO")
    text = render(load(read, names), source, errors)
    with open(args.output, "w") as f:
        f.write(text)
    print(f"wrote {args.output}: {len(names)} schemas", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
