"""``kraftlog chaos fuzz``: a seeded, structure-aware fuzz campaign against
a cluster of real processes.

Every HTTP route of the broker and the controller starts from a valid
example body (``ROUTES``); each request mutates one (a field replaced by a
value of another type or an extreme one, removed, an unknown one added, a
list grown, a record batch's bytes flipped or cut, a name made invalid) or
mangles the encoded bytes (cut, flipped, garbage, the wrong content type,
JSON instead of msgpack). The oracle (``judge``) holds every answer to what
users depend on: never a 500 or an ``UNKNOWN_SERVER_ERROR`` (top level or
per item), every refusal a ``{"error": {"code", "message"}}`` body, an
answer within ``ANSWER_DEADLINE_S`` (longer than any wait a request may
ask for), no dropped connection; and after the run every node is still up
and a new topic takes and serves acks=all writes.

The first input that reaches each new (route, status, error code) is
"interesting": ``--save-corpus`` appends those to a JSON-lines file, and
``--corpus`` replays such a file before the random inputs (the project
keeps one in ``tests/fuzz_corpus/``, replayed by CI).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import functools
import json
import os
import random
import time
from typing import Any, Callable

import msgpack

MSGPACK = "application/msgpack"
#: Longer than any wait a request may ask for (fetch and watch long-polls
#: are capped at 60 s, admin calls at their timeout): no answer by then is a
#: hang.
ANSWER_DEADLINE_S = 75.0
#: Requests in flight at once (long-polls must not stall the campaign).
CONCURRENCY = 8
#: Bodies larger than this are not kept in a corpus file (huge lists and
#: strings are made again by any run; a kept corpus stays small).
CORPUS_INPUT_BYTES_MAX = 16 * 1024
TOPIC = "fuzz"
GROUP = "fuzz-group"
TXN = "fuzz-txn"


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    node: str = "broker"  # or "controller"
    body: Any = None  # the valid example (POST)


@functools.cache
def _batch() -> bytes:
    """One valid batch (made once: it carries the time it was made)."""
    from api.client import encode_batch
    return encode_batch([(b"k", b"value")])


def _tp(**more: Any) -> dict:
    return {"topic": TOPIC, "partition": 0, **more}


def routes() -> list[Route]:
    """Every route with a valid example of its body."""
    batch = _batch()
    acl = {"resource_type": "TOPIC", "resource_name": TOPIC, "pattern_type": "LITERAL",
           "principal": "User:fuzz", "host": "*", "operation": "READ",
           "permission_type": "ALLOW"}
    post = [
        ("/v1/produce", {"acks": -1, "timeout_ms": 5000,
                         "partitions": [_tp(records=batch)]}),
        ("/v1/fetch", {"max_wait_ms": 100, "partitions": [_tp(offset=0)]}),
        ("/v1/fetch", {"replica_id": 2, "replica_epoch": 1, "max_wait_ms": 100,
                       "session_id": 0, "session_epoch": 0,
                       "partitions": [_tp(offset=0, current_leader_epoch=0,
                                          last_fetched_epoch=-1)]}),
        ("/v1/offsets", {"partitions": [_tp(timestamp=-1)]}),
        ("/v1/txn/markers", {"markers": [_tp(producer_id=1, producer_epoch=0,
                                             coordinator_epoch=0, committed=True)]}),
        ("/v1/metadata", {"topics": [TOPIC]}),
        ("/v1/groups/coordinator", {"group_id": GROUP}),
        ("/v1/groups/heartbeat", {"group_id": GROUP, "member_id": "", "member_epoch": 0,
                                  "subscribed_topic_names": [TOPIC],
                                  "rebalance_timeout_ms": 5000}),
        ("/v1/groups/watch", {"group_id": GROUP, "member_id": "m", "max_wait_ms": 100}),
        ("/v1/groups/offsets/commit", {"group_id": GROUP, "member_id": "", "member_epoch": -1,
                                       "offsets": [_tp(offset=0, metadata="")]}),
        ("/v1/groups/offsets/fetch", {"group_id": GROUP, "partitions": [_tp()]}),
        ("/v1/groups/offsets/txn_commit", {"group_id": GROUP, "transactional_id": TXN,
                                           "producer_id": 1, "producer_epoch": 0,
                                           "offsets": [_tp(offset=0)]}),
        ("/v1/admin/groups/delete", {"group_id": GROUP}),
        ("/v1/admin/groups/offsets/reset", {"group_id": GROUP, "offsets": [_tp(offset=0)]}),
        ("/v1/producers/init", {"transactional_id": None}),
        ("/v1/transactions/coordinator", {"transactional_id": TXN}),
        ("/v1/transactions/add_partitions", {"transactional_id": TXN, "producer_id": 1,
                                             "producer_epoch": 0, "partitions": [_tp()]}),
        ("/v1/transactions/end", {"transactional_id": TXN, "producer_id": 1,
                                  "producer_epoch": 0, "committed": True}),
        ("/v1/transactions/verify", {"transactional_id": TXN, "producer_id": 1,
                                     "producer_epoch": 0, "partitions": [_tp()]}),
        ("/v1/admin/transactions/abort", {"transactional_id": TXN}),
        ("/v1/admin/topics/create", {"topics": [{"name": "fuzz-new", "num_partitions": 1,
                                                 "replication_factor": 1}],
                                     "validate_only": True}),
        ("/v1/admin/topics/delete", {"topics": ["fuzz-absent"]}),
        ("/v1/admin/topics/describe", {"topics": [TOPIC]}),
        ("/v1/admin/partitions/create", {"topics": [{"name": TOPIC, "count": 2}],
                                         "validate_only": True}),
        ("/v1/admin/configs/describe", {"resources": [{"type": "topic", "name": TOPIC}]}),
        ("/v1/admin/configs/alter", {"resources": [{"type": "topic", "name": TOPIC, "ops": [
            {"name": "retention.ms", "op": "set", "value": 86_400_000}]}]}),
        ("/v1/admin/leaders/elect", {"partitions": [_tp()]}),
        ("/v1/admin/partitions/reassign", {"partitions": [_tp(replicas=None)]}),
        ("/v1/admin/partitions/reassignments", {"topics": None}),
        ("/v1/admin/quotas/alter", {"entries": [{"entity": {"client-id": "fuzz"}, "ops": [
            {"key": "producer_byte_rate", "value": 1e9}]}]}),
        ("/v1/admin/quotas/describe", {"entity": {"client-id": "fuzz"}}),
        ("/v1/admin/users/alter", {"upsertions": [], "deletions": [
            {"name": "fuzz-absent", "mechanism": "SCRAM-SHA-256"}]}),
        ("/v1/admin/users/describe", {"users": ["fuzz"]}),
        ("/v1/admin/acls/create", {"creations": [acl]}),
        ("/v1/admin/acls/delete", {"filters": [acl]}),
        ("/v1/admin/acls/describe", {"filter": {"resource_type": "TOPIC"}}),
        ("/v1/admin/tokens/create", {"max_lifetime_ms": 60_000}),
        ("/v1/admin/tokens/renew", {"token_id": "x", "hmac": "eA=="}),
        ("/v1/admin/tokens/expire", {"token_id": "x", "hmac": "eA==", "expiry_period_ms": -1}),
        ("/v1/admin/tokens/describe", {"owners": None}),
        ("/topics/fuzz", {"records": [{"key": "k", "value": "v"}]}),
    ]
    get = ["/v1/metadata?topics=fuzz", "/topics/fuzz/partitions/0/records?offset=0",
           "/topics/fuzz/partitions/0/offsets", "/v1/groups", f"/v1/groups/{GROUP}",
           "/v1/transactions", f"/v1/transactions/{TXN}", "/ui", "/ui/static/app.js",
           "/healthz", "/metrics", "/v1/cluster", "/v1/brokers", "/v1/topics",
           "/v1/topics/fuzz", "/v1/quorum", "/v1/log-dirs", "/v1/metrics/topics"]
    # The controller's routes. Broker lifecycle calls name broker 99, which
    # does not exist: fuzzing them must not fence or stop a real broker.
    controller = [
        ("brokers/register", {"broker_id": 99, "incarnation_id": "fuzz",
                              "endpoints": {"BROKER": "127.0.0.1:1"}, "rack": None}),
        ("brokers/heartbeat", {"broker_id": 99, "broker_epoch": 0, "metadata_offset": 0}),
        ("brokers/presence", {"broker_id": 99, "broker_epoch": 0}),
        ("metadata", {"offset": 0}),
        ("topics/create", {"topics": [{"name": "fuzz-c", "num_partitions": 1}],
                           "validate_only": True}),
        ("topics/delete", {"topics": ["fuzz-absent"]}),
        ("partitions/create", {"topics": [{"name": TOPIC, "count": 2}], "validate_only": True}),
        ("configs/alter", {"resources": [{"type": "topic", "name": "fuzz-absent", "ops": []}]}),
        ("configs/describe", {"resources": [{"type": "topic", "name": TOPIC}]}),
        ("quotas/alter", {"entries": []}),
        ("quotas/describe", {"entity": {}}),
        ("users/alter", {"upsertions": [], "deletions": []}),
        ("users/describe", {"users": None}),
        ("acls/create", {"creations": []}),
        ("acls/delete", {"filters": []}),
        ("tokens/create", {"owner": "User:fuzz", "requester": "User:fuzz", "renewers": []}),
        ("tokens/renew", {"token_id": "x", "hmac": "eA==", "requester": "User:fuzz"}),
        ("tokens/expire", {"token_id": "x", "hmac": "eA==", "requester": "User:fuzz"}),
        ("partitions/alter", {"broker_id": 99, "broker_epoch": 0, **_tp(),
                              "leader_epoch": 0, "partition_epoch": 0, "new_isr": [99]}),
        ("partitions/alter-many", {"broker_id": 99, "broker_epoch": 0, "partitions": [
            {**_tp(), "leader_epoch": 0, "partition_epoch": 0, "new_isr": [99]}]}),
        ("leaders/elect", {"partitions": [_tp()]}),
        ("partitions/reassign", {"partitions": [_tp(replicas=None)]}),
        ("partitions/reassignments", {"topics": None}),
        ("producer_ids/allocate", {"broker_id": 99, "broker_epoch": 0}),
    ]
    return ([Route("POST", path, body=body) for path, body in post]
            + [Route("GET", path) for path in get]
            + [Route("POST", f"/v1/controller/{path}", "controller", body)
               for path, body in controller]
            + [Route("GET", path, "controller") for path in ("/v1/quorum", "/v1/metadata",
                                                             "/healthz")])


# -- mutations --------------------------------------------------------------------------------
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**31 - 1, 2**31, -2**31 - 1, 2**63 - 1, -2**63, 2**64 - 1,
    0.5, -0.0, float("nan"), float("inf"), "", " ", "x" * 5000, "\x00", "é☃", "../etc/passwd",
    "__consumer_offsets", "fuzz", "-1", b"", b"\x00\xff" * 8, [], [None], {}, {"": None},
    {"topic": None}, [[[]]],
]


def _deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every place in ``value`` a mutation may touch (the root included)."""
    found = [prefix]
    if len(prefix) > 30:  # inside a deep nesting already made
        return found
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, prefix + (i,))
    return found


def _size(value: Any) -> int:
    """Items in ``value``, counted up to a bound (lists may share items)."""
    count, stack = 0, [value]
    while stack and count < 1_000_000:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return count


def _get(value: Any, path: tuple) -> Any:
    for step in path:
        value = value[step]
    return value


def _set(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    _get(value, path[:-1])[path[-1]] = new
    return value


def mutate_value(rng: random.Random, body: Any) -> Any:
    """One structural mutation of (a copy of) ``body``."""
    body = copy.deepcopy(body)
    path = rng.choice(_paths(body))
    target = _get(body, path)
    parent = _get(body, path[:-1]) if path else None
    roll = rng.random()
    if isinstance(target, bytes) and target and roll < 0.6:
        data = bytearray(target)
        kind = rng.randrange(4)
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del data[rng.randrange(len(data)):]
        elif kind == 2:
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
        else:
            data = data * rng.randint(2, 50)
        return _set(body, path, bytes(data))
    if isinstance(parent, dict) and roll < 0.25:
        del parent[path[-1]]
        return body
    if isinstance(target, dict) and roll < 0.35:
        target[rng.choice(["x", "", "partitions", "topic", "\x00"])] = rng.choice(ODD_VALUES)
        return body
    if isinstance(target, list) and target and roll < 0.45 and _size(body) < 50_000:
        # Many copies of one item (shared, so the body stays cheap to build).
        target.extend([target[0]] * rng.choice([1, 10, 1000, 12_000]))
        return body
    if isinstance(target, str) and roll < 0.55:
        return _set(body, path, rng.choice(["", "a" * 300, "a/b", "with space", "\ud7ff",
                                            target[:100] * 1000, target.upper()]))
    if isinstance(target, int) and not isinstance(target, bool) and roll < 0.65:
        return _set(body, path, target + rng.choice([-1, 1, -2**31, 2**40]))
    if roll < 0.70:
        return _set(body, path, _deep(rng.choice([40, 200])))
    return _set(body, path, rng.choice(ODD_VALUES))


@dataclasses.dataclass
class Input:
    """One request as sent: what ``--corpus`` files hold, one per line."""

    method: str
    path: str
    node: str
    content_type: str
    data: bytes
    why: str = ""

    def to_json(self) -> str:
        return json.dumps({"method": self.method, "path": self.path, "node": self.node,
                           "content_type": self.content_type,
                           "body_b64": base64.b64encode(self.data).decode(), "why": self.why})

    @classmethod
    def from_json(cls, line: str) -> "Input":
        entry = json.loads(line)
        return cls(entry["method"], entry["path"], entry["node"], entry["content_type"],
                   base64.b64decode(entry["body_b64"]), entry.get("why", ""))


def _pack(body: Any) -> bytes | None:
    try:
        return msgpack.packb(body, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return None


def make_input(rng: random.Random, route: Route) -> Input:
    """A random request to ``route``: mostly a structural mutation of its
    example, sometimes mangled bytes, sometimes the example as it is."""
    if route.method == "GET":
        path = route.path
        roll = rng.random()
        if roll < 0.3:
            path += ("&" if "?" in path else "?") + rng.choice([
                "offset=-5", "offset=99999999999999999999", "limit=abc", "topics=",
                "local=maybe", "group_id=%00", "max_wait_ms=-1", "x=" + "y" * 3000])
        elif roll < 0.6:
            pieces = path.split("/")
            i = rng.randrange(1, len(pieces))
            pieces[i] = rng.choice(["%2e%2e", "-1", "99999999999", "%00", "a" * 400, "%ff",
                                    ""])
            path = "/".join(pieces)
        return Input("GET", path, route.node, "", b"", "")
    body = route.body
    if rng.random() >= 0.05:  # else the example as it is
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            body = mutate_value(rng, body)
    data = _pack(body)
    if data is None:
        data = _pack(route.body) or b""
    content_type = MSGPACK
    roll = rng.random()
    if roll < 0.06:
        data = data[:rng.randrange(len(data) + 1)]
    elif roll < 0.10:
        data = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    elif roll < 0.13:
        content_type = "application/json"
        data = json.dumps(route.body, default=lambda v: base64.b64encode(v).decode()
                          ).encode()[:rng.randint(0, 400)]
    elif roll < 0.15:
        content_type = rng.choice(["text/plain", "application/x-www-form-urlencoded", ""])
    elif roll < 0.16:
        data = b"\xdd\xff\xff\xff\xff"  # msgpack: an array claiming 4 G items
    return Input("POST", route.path, route.node, content_type, data, "")


# -- the oracle --------------------------------------------------------------------------------
def judge(status: int | None, body: bytes, elapsed_s: float, content_type: str = MSGPACK
          ) -> tuple[str | None, str | None]:
    """(error code seen, finding or None) for one answer: ``status`` None
    means the connection dropped with no answer."""
    if status is None:
        return None, "the connection closed with no answer"
    if elapsed_s > ANSWER_DEADLINE_S:
        return None, f"answered after {elapsed_s:.1f} s (a hang)"
    decoded: Any = None
    if body:
        try:
            decoded = (msgpack.unpackb(body, raw=False, strict_map_key=False)
                       if content_type.startswith(MSGPACK) else json.loads(body))
        except Exception:  # noqa: BLE001  text pages (the console, /metrics)
            decoded = None
    code = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        code = decoded["error"].get("code")
    if status >= 500 and status != 503:
        return code, f"HTTP {status}"
    if "UNKNOWN_SERVER_ERROR" in _codes(decoded):
        return "UNKNOWN_SERVER_ERROR", "an UNKNOWN_SERVER_ERROR in the answer"
    if status >= 400 and not (isinstance(code, str) and code and isinstance(
            decoded["error"].get("message"), str)):
        return code, f"HTTP {status} without an error code and message"
    return code, None


def _codes(value: Any, depth: int = 0) -> set[str]:
    """Every ``error.code`` in an answer, per item included."""
    found: set[str] = set()
    if depth > 6:
        return found
    if isinstance(value, dict):
        error = value.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            found.add(error["code"])
        for item in value.values():
            if isinstance(item, (dict, list)):
                found |= _codes(item, depth + 1)
    elif isinstance(value, list):
        for item in value[:2000]:
            found |= _codes(item, depth + 1)
    return found


# -- the campaign ----------------------------------------------------------------------------
@dataclasses.dataclass
class Report:
    requests: int = 0
    by_route: dict[str, int] = dataclasses.field(default_factory=dict)
    outcomes: set = dataclasses.field(default_factory=set)
    interesting: list[Input] = dataclasses.field(default_factory=list)
    findings: list[dict] = dataclasses.field(default_factory=list)


async def campaign(urls: Callable[[str], str], seed: int, duration_s: float,
                   corpus: list[Input], progress: Callable[[Report], None] | None = None
                   ) -> Report:
    """Send the corpus, then random inputs until ``duration_s`` passes."""
    import aiohttp

    rng = random.Random(seed)
    all_routes = routes()
    report = Report()
    queue: asyncio.Queue[Input | None] = asyncio.Queue(maxsize=CONCURRENCY * 2)
    deadline = time.monotonic() + duration_s
    timeout = aiohttp.ClientTimeout(total=ANSWER_DEADLINE_S + 5)

    async def produce_inputs() -> None:
        for item in corpus:
            await queue.put(item)
        i = 0
        while time.monotonic() < deadline:
            # Every route in turn, so a short run still covers them all.
            await queue.put(make_input(rng, all_routes[i % len(all_routes)]))
            i += 1
        for _ in range(CONCURRENCY):
            await queue.put(None)

    async def send(session: aiohttp.ClientSession, item: Input) -> None:
        url = urls(item.node) + item.path
        headers = {"Accept": MSGPACK}
        if item.content_type:
            headers["Content-Type"] = item.content_type
        started = time.monotonic()
        status, body, answer_type = None, b"", ""
        try:
            async with session.request(item.method, url, data=item.data or None,
                                       headers=headers) as response:
                status, body = response.status, await response.read()
                answer_type = response.content_type
        except asyncio.TimeoutError:
            status = -1
        except aiohttp.ClientError:
            status = None
        elapsed = time.monotonic() - started
        if status == -1:
            code, finding = None, f"no answer within {ANSWER_DEADLINE_S:.0f} s (a hang)"
        else:
            code, finding = judge(status, body, elapsed, answer_type or MSGPACK)
        route = item.path.split("?")[0]
        report.requests += 1
        report.by_route[route] = report.by_route.get(route, 0) + 1
        outcome = (item.method, route, status, code)
        if outcome not in report.outcomes:
            report.outcomes.add(outcome)
            report.interesting.append(dataclasses.replace(
                item, why=f"first {status} {code or ''}".strip()))
        if finding is not None:
            report.findings.append({"finding": finding, "status": status, "code": code,
                                    "answer": body[:300].decode("utf-8", "replace"),
                                    "input": json.loads(item.to_json())})

    async def worker(session: aiohttp.ClientSession) -> None:
        while (item := await queue.get()) is not None:
            await send(session, item)
            if progress is not None and report.requests % 200 == 0:
                progress(report)

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(produce_inputs(), *(worker(session) for _ in range(CONCURRENCY)))
    return report


def read_corpus(path: str) -> list[Input]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [Input.from_json(line) for line in f if line.strip()]


# -- a whole run: cluster, campaign, health afterwards -------------------------------------------
def run(out_dir: str, brokers: int, seed: int, duration_s: float, corpus: list[Input],
        say: Callable[[str], None]) -> tuple[dict, list[Input]]:
    """Start a cluster in ``out_dir``, fuzz it, check it is still whole.
    Returns the summary (findings written to ``out_dir/findings.jsonl``)
    and the interesting inputs."""
    from chaos.cluster import FAST_SETTINGS, ProcessCluster, wait_until

    os.makedirs(out_dir, exist_ok=True)
    replication = min(3, brokers)
    with ProcessCluster(os.path.join(out_dir, "cluster"), controllers=1, brokers=brokers,
                        settings=FAST_SETTINGS) as cluster:
        say(f"starting 1 controller + {brokers} brokers in {out_dir} ...")
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=60)
        _create_topic(cluster, TOPIC, 3, replication)
        broker_urls = [cluster.nodes[b].broker_url for b in cluster.broker_ids]
        turn = iter(range(10**12))

        def url_of(node: str) -> str:
            if node == "controller":
                active = cluster.active_controller()
                return cluster.nodes[active if active is not None
                                     else cluster.controller_ids[0]].controller_url
            return broker_urls[next(turn) % len(broker_urls)]

        def progress(report: Report) -> None:
            say(f"  {report.requests:,} requests, {len(report.outcomes):,} outcomes, "
                f"{len(report.findings)} findings")

        say(f"fuzzing {len({r.path.split('?')[0] for r in routes()})} routes for "
            f"{duration_s:.0f} s (seed {seed}"
            f"{f', {len(corpus)} corpus inputs first' if corpus else ''}) ...")
        started = time.monotonic()
        report = asyncio.run(campaign(url_of, seed, duration_s, corpus, progress))
        elapsed = time.monotonic() - started
        dead = [n for n, node in cluster.nodes.items() if not node.running]
        say("checking the cluster afterwards: every node up, a new topic writable ...")
        canary_error = None if dead else _canary(cluster, replication, wait_until)
    with open(os.path.join(out_dir, "findings.jsonl"), "w", encoding="utf-8") as f:
        for finding in report.findings:
            f.write(json.dumps(finding) + "\n")
    covered = {r.path.split("?")[0] for r in routes()}
    summary = {
        "seed": seed, "duration_s": round(elapsed, 1), "requests": report.requests,
        "routes": len(covered),
        "routes_reached": len(covered & set(report.by_route)),
        "outcomes": len(report.outcomes), "corpus_inputs": len(corpus),
        "findings": report.findings[:50], "findings_count": len(report.findings),
        "dead_nodes": dead, "canary_error": canary_error,
        "cluster_ok": not dead and canary_error is None, "out": out_dir}
    return summary, report.interesting


def _create_topic(cluster: Any, name: str, partitions: int, replication: int) -> None:
    from chaos.cluster import http_json, wait_until

    code, body = cluster.controller_call("/v1/controller/topics/create", {"topics": [{
        "name": name, "num_partitions": partitions, "replication_factor": replication}]},
        timeout_s=30)
    if code != 200 or body["topics"][0]["error"] is not None:
        raise RuntimeError(f"cannot create {name}: {body}")
    url = cluster.nodes[cluster.broker_ids[0]].broker_url

    def led() -> bool:
        status, answer = http_json(f"{url}/v1/topics/{name}", timeout_s=10)
        return status == 200 and all(p["leader"] >= 0 for p in answer["partitions"])
    wait_until(led, 60, f"a leader for every partition of {name}")


def _canary(cluster: Any, replication: int, wait_until: Callable) -> str | None:
    """None if a new topic takes 100 acks=all writes and serves them back
    (client quotas the campaign may have set removed first), once every
    broker is running again: one that fenced itself while the campaign kept
    the controller busy (heartbeats unanswered for a session) comes back
    with its next heartbeat, and a cluster that does so is whole."""
    from api.client import Admin, Consumer, Producer, TopicPartition

    name = "fuzz-canary"
    try:
        cluster.wait_for_brokers_running(timeout_s=60)
        urls = [cluster.nodes[b].broker_url for b in cluster.broker_ids]
        with Admin(urls) as admin:  # a quota the campaign set may legitimately throttle
            for entity, quotas in admin.describe_client_quotas():
                admin.alter_client_quotas(entity, {key: None for key in quotas})
        _create_topic(cluster, name, 1, replication)
        values = [f"canary-{i}".encode() for i in range(100)]
        with Producer(urls, acks="all", linger_ms=2) as producer:
            for value in values:
                producer.send(name, value, partition=0)
            producer.flush(timeout_ms=30_000)
        seen: list[bytes] = []
        with Consumer(urls, auto_offset_reset="earliest") as consumer:
            consumer.assign([TopicPartition(name, 0)])

            def read_all() -> bool:
                seen.extend(r.value for r in consumer.poll(timeout_ms=200))
                return len(seen) >= len(values)
            wait_until(read_all, 30, "the canary's 100 records read back")
        if seen != values:
            return f"read back {len(seen)} records, not the 100 written in order"
    except Exception as exc:  # noqa: BLE001  reported, not raised: the run's verdict
        return f"{type(exc).__name__}: {exc}"
    return None


def summary_text(summary: dict) -> str:
    from api.table import format_table

    rows = [("requests", f"{summary['requests']:,} in {summary['duration_s']:,} s"),
            ("routes reached", f"{summary['routes_reached']} of {summary['routes']}"),
            ("distinct outcomes", f"{summary['outcomes']:,} (route, status, error code)"),
            ("corpus inputs replayed", str(summary["corpus_inputs"])),
            ("findings", str(summary["findings_count"])),
            ("nodes that died", ", ".join(map(str, summary["dead_nodes"])) or "none"),
            ("cluster afterwards", "writable and readable" if summary["canary_error"] is None
             else f"BROKEN: {summary['canary_error']}")]
    lines = [format_table(("FUZZ", "RESULT"), rows)]
    for finding in summary["findings"][:10]:
        item = finding["input"]
        lines.append(f"  {finding['finding']}: {item['method']} {item['path']} "
                     f"({item['why'] or 'input in findings.jsonl'}): {finding['answer'][:120]}")
    lines.append(f"details: {summary['out']}")
    return "\n".join(lines)
