"""`kraftlog topics|partitions|produce|consume` as a user runs them: real CLI
processes against one real single node (started once for the module), and,
for moving partitions between brokers, a cluster of three brokers.

Every call is ``python -m api.cli --bootstrap URL ...`` in its own process,
with a timeout. Each test uses its own topics, so the tests do not depend on
one another's order."""

import json
import os
import subprocess
import sys
import time

import pytest

from api.client import Admin, NewTopic, Producer
from chaos.cluster import ProcessCluster, wait_until

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DESCRIBE_COLUMNS = ("PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "LOG-START", "LSO",
                    "HIGH-WATERMARK", "LOG-END", "SIZE")
CLEANER_COLUMNS = ("CLEANABLE", "LAST-CLEAN")


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("console")), controllers=1, brokers=0,
                        combined=True) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster.nodes[1].broker_url


def kraftlog(url, *args, stdin="", timeout=30):
    return subprocess.run([sys.executable, "-m", "api.cli", "--bootstrap", url, *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT)


def ok(result):
    assert result.returncode == 0, result.stderr
    return result


def fails(result, *fragments):
    """Exit status 1 and one line on stderr, ``kraftlog: ...``, naming each
    fragment (no traceback)."""
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kraftlog: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def create(url, name, *args):
    out = ok(kraftlog(url, "topics", "create", name, *args)).stdout
    assert out == f"Created topic {name}.\n"


def produce(url, topic, lines, *args):
    result = ok(kraftlog(url, "produce", topic, *args, stdin="".join(l + "\n" for l in lines)))
    noun = "record" if len(lines) == 1 else "records"
    # The result on stdout, like every command's; stderr only for trouble.
    assert result.stdout == f"Produced {len(lines)} {noun} to {topic}.\n"
    assert result.stderr == ""


def listed(url):
    """``topics list`` as {topic: (partitions, replication)}."""
    lines = ok(kraftlog(url, "topics", "list")).stdout.splitlines()
    if lines == ["No topics. Create one: kraftlog topics create NAME --partitions 3"]:
        return {}
    assert lines[0].split() == ["TOPIC", "PARTITIONS", "REPLICATION"]
    return {name: (int(partitions), int(replication))
            for name, partitions, replication in (line.split() for line in lines[1:])}


def describe(url, *names):
    """``topics describe`` as {topic: (header fields, [row per partition])}."""
    out = ok(kraftlog(url, "topics", "describe", *names)).stdout
    topics = {}
    for block in out.strip().split("\n\n"):
        header, columns, *rows = block.splitlines()
        fields = dict(field.split(": ", 1) for field in header.split("\t"))
        # A compacted topic has two more columns.
        assert tuple(columns.split()) in (DESCRIBE_COLUMNS, DESCRIBE_COLUMNS + CLEANER_COLUMNS)
        topics[fields["Topic"]] = (fields, [describe_row(row) for row in rows])
    return topics


def describe_row(row: str) -> dict:
    """One partition's row. SIZE holds a space ("85 B", or "-" when
    unknown), and so does LAST-CLEAN (a timestamp, or "never")."""
    parts = row.split()
    entry = dict(zip(DESCRIBE_COLUMNS[:9], parts[:9]))
    size_words = 1 if parts[9] == "-" else 2
    entry["SIZE"] = " ".join(parts[9:9 + size_words])
    rest = parts[9 + size_words:]
    if rest:
        entry["CLEANABLE"], entry["LAST-CLEAN"] = rest[0], " ".join(rest[1:])
    return entry


def consume(url, topic, *args, timeout=30):
    return ok(kraftlog(url, "consume", topic, *args, timeout=timeout))


# -- topics -------------------------------------------------------------------------------
def test_create_then_list_and_describe_show_partitions_configs_and_leaders(url):
    create(url, "orders", "--partitions", "3", "--config", "retention.ms=3600000")

    assert listed(url)["orders"] == (3, 1)
    fields, rows = describe(url, "orders")["orders"]
    assert fields["PartitionCount"] == "3"
    assert fields["Configs"] == "retention.ms=3600000"
    assert len(fields["TopicId"]) >= 16
    assert [row["PARTITION"] for row in rows] == ["0", "1", "2"]
    for row in rows:
        assert row["LEADER"] == "1" and row["REPLICAS"] == "1" and row["ISR"] == "1"
        assert int(row["EPOCH"]) >= 0
        assert (row["LOG-START"], row["HIGH-WATERMARK"], row["LOG-END"], row["SIZE"]) == (
            "0", "0", "0", "0 B")


def test_creating_an_existing_topic_fails_unless_if_not_exists(url):
    create(url, "payments", "--partitions", "2")

    line = fails(kraftlog(url, "topics", "create", "payments", "--partitions", "2"),
                 "TOPIC_ALREADY_EXISTS", "'payments'")
    assert "already exists" in line
    quiet = ok(kraftlog(url, "topics", "create", "payments", "--partitions", "7",
                        "--config", "retention.ms=1000", "--if-not-exists"))
    assert quiet.stdout == "" and quiet.stderr == ""
    # --if-not-exists leaves the existing topic exactly as it was.
    fields, rows = describe(url, "payments")["payments"]
    assert (fields["PartitionCount"], fields["ReplicationFactor"], fields["Configs"],
            len(rows)) == ("2", "1", "-", 2)


def test_a_topic_no_acks_all_write_could_reach_is_refused_with_the_fix(url):
    line = fails(kraftlog(url, "topics", "create", "unwritable", "--replication-factor", "1",
                          "--config", "min.insync.replicas=2"),
                 "INVALID_REPLICATION_FACTOR", "min.insync.replicas=2",
                 "--config min.insync.replicas=1")
    assert "no acks=all write could ever succeed" in line
    create(url, "writable", "--replication-factor", "1")
    fails(kraftlog(url, "topics", "alter", "writable", "--config", "min.insync.replicas=2"),
          "INVALID_CONFIG", "keep min.insync.replicas at most 1")


def test_every_cli_error_is_one_line_naming_its_code_once(url):
    """The error paths a user meets, each: exit 1, one line, the code once."""
    create(url, "one-line", "--partitions", "1")
    cases = [
        (("topics", "create", "one-line"), "TOPIC_ALREADY_EXISTS"),
        (("topics", "create", "bad/name"), "INVALID_TOPIC_EXCEPTION"),
        (("topics", "describe", "no-such"), "UNKNOWN_TOPIC_OR_PARTITION"),
        (("topics", "alter", "no-such", "--partitions", "3"), "UNKNOWN_TOPIC_OR_PARTITION"),
        (("topics", "alter", "one-line", "--partitions", "1"), "INVALID_PARTITIONS"),
        (("topics", "delete", "no-such"), "UNKNOWN_TOPIC_OR_PARTITION"),
        (("consume", "no-such", "--timeout-ms", "300"), "UNKNOWN_TOPIC_OR_PARTITION"),
        (("consume", "one-line", "--partition", "0", "--offset", "5"), "OFFSET_OUT_OF_RANGE"),
        (("groups", "describe", "no-such-group"), "GROUP_ID_NOT_FOUND"),
        (("groups", "delete", "no-such-group"), "GROUP_ID_NOT_FOUND"),
        (("groups", "reset-offsets", "g", "--topic", "no-such", "--to-earliest"),
         "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    for argv, code in cases:
        result = kraftlog(url, *argv)
        line = fails(result, code)
        assert line.count(code) == 1, (argv, line)


def test_kafka_spellings_topic_flag_and_schemeless_bootstrap_server(url):
    """What Kafka's tools take: --bootstrap-server host:port and --topic."""
    host_port = url.removeprefix("http://")
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "--bootstrap-server", host_port, "topics", "create",
         "--topic", "kafka-habits", "--partitions", "1"],
        capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    assert result.returncode == 0 and result.stdout == "Created topic kafka-habits.\n", result
    ok(kraftlog(url, "produce", "--topic", "kafka-habits", stdin="one\n"))
    got = ok(kraftlog(url, "consume", "--topic", "kafka-habits", "--from-beginning",
                      "--max-messages", "1"))
    assert got.stdout == "one\n"
    assert "kafka-habits" in ok(kraftlog(url, "topics", "describe", "--topic",
                                         "kafka-habits")).stdout
    fails(kraftlog(url, "produce", "kafka-habits", "--topic", "other", stdin="x\n"),
          "two topics given")
    fails(kraftlog(url, "consume"), "name the topic")


def test_list_filters_by_regex_and_leaves_out_internal_topics(url):
    create(url, "filter-orders", "--partitions", "1")
    create(url, "filter-payments", "--partitions", "1")
    ok(kraftlog(url, "consume", "filter-orders", "--group", "filter-group",
                "--timeout-ms", "500"))  # a group: __consumer_offsets exists
    everything = ok(kraftlog(url, "topics", "list")).stdout
    assert "__consumer_offsets" in everything
    only = ok(kraftlog(url, "topics", "list", "--include", "filter-o.*")).stdout
    assert [line.split()[0] for line in only.splitlines()[1:]] == ["filter-orders"]
    public = ok(kraftlog(url, "topics", "list", "--exclude-internal")).stdout
    assert "__consumer_offsets" not in public and "filter-payments" in public
    fails(kraftlog(url, "topics", "list", "--include", "(unclosed"),
          "is not a regular expression")


def test_describe_shows_each_partitions_offsets_and_size(url):
    create(url, "offsets", "--partitions", "3")
    produce(url, "offsets", ["x", "y", "z"], "--partition", "2")

    topics = describe(url)  # without a name: every topic
    assert set(topics) == set(listed(url)) and "offsets" in topics
    rows = {row["PARTITION"]: row for row in topics["offsets"][1]}
    assert (rows["2"]["LOG-START"], rows["2"]["HIGH-WATERMARK"], rows["2"]["LOG-END"]) == (
        "0", "3", "3")
    size, unit = rows["2"]["SIZE"].split()
    assert unit == "B" and int(size) > 3
    for p in ("0", "1"):
        assert (rows[p]["HIGH-WATERMARK"], rows[p]["LOG-END"], rows[p]["SIZE"]) == (
            "0", "0", "0 B")


def test_alter_adds_partitions_and_sets_and_deletes_configs(url):
    create(url, "growing", "--partitions", "3", "--config", "retention.ms=3600000")

    out = ok(kraftlog(url, "topics", "alter", "growing", "--partitions", "5")).stdout
    assert out == "Topic growing now has 5 partitions.\n"
    fields, rows = describe(url, "growing")["growing"]
    assert fields["PartitionCount"] == "5"
    assert [row["PARTITION"] for row in rows] == ["0", "1", "2", "3", "4"]
    assert all(row["LEADER"] == "1" and row["ISR"] == "1" for row in rows)
    assert listed(url)["growing"] == (5, 1)

    ok(kraftlog(url, "topics", "alter", "growing", "--config", "segment.bytes=1048576",
                "--config", "retention.ms=7200000"))
    assert describe(url, "growing")["growing"][0]["Configs"] == (
        "retention.ms=7200000,segment.bytes=1048576")
    out = ok(kraftlog(url, "topics", "alter", "growing", "--delete-config",
                      "retention.ms")).stdout
    assert "retention.ms=(default)" in out
    assert describe(url, "growing")["growing"][0]["Configs"] == "segment.bytes=1048576"

    # Refusals change nothing.
    fails(kraftlog(url, "topics", "alter", "growing", "--partitions", "2"),
          "INVALID_PARTITIONS")
    fails(kraftlog(url, "topics", "alter", "growing", "--config", "bogus.key=1"),
          "INVALID_CONFIG", "bogus.key")
    fails(kraftlog(url, "topics", "alter", "growing", "--config", "retention.ms"),
          "KEY=VALUE")
    fails(kraftlog(url, "topics", "alter", "growing"), "nothing to alter")
    fields, _ = describe(url, "growing")["growing"]
    assert (fields["PartitionCount"], fields["Configs"]) == ("5", "segment.bytes=1048576")


def test_delete_removes_the_topic_and_its_data(url):
    create(url, "doomed", "--partitions", "2")
    produce(url, "doomed", ["old"])
    old_id = describe(url, "doomed")["doomed"][0]["TopicId"]

    out = ok(kraftlog(url, "topics", "delete", "doomed")).stdout
    assert out == "Deleted topic doomed.\n"
    assert "doomed" not in listed(url)
    fails(kraftlog(url, "topics", "describe", "doomed"), "UNKNOWN_TOPIC_OR_PARTITION")
    fails(kraftlog(url, "topics", "delete", "doomed"), "UNKNOWN_TOPIC_OR_PARTITION")

    # The name is free again, for a new, empty topic.
    create(url, "doomed", "--partitions", "1")
    fields, rows = describe(url, "doomed")["doomed"]
    assert fields["TopicId"] != old_id
    assert [(r["HIGH-WATERMARK"], r["LOG-END"]) for r in rows] == [("0", "0")]


def test_invalid_topic_names_are_refused(url):
    line = fails(kraftlog(url, "topics", "create", "bad name!"), "INVALID_TOPIC_EXCEPTION",
                 "'bad name!'")
    assert "may only contain" in line
    fails(kraftlog(url, "topics", "create", "bad-config", "--config", "nonsense"), "KEY=VALUE")
    assert "bad name!" not in listed(url) and "bad-config" not in listed(url)


def test_describe_of_an_unknown_topic_says_it_does_not_exist(url):
    fails(kraftlog(url, "topics", "describe", "no-such-topic"),
          "UNKNOWN_TOPIC_OR_PARTITION", "topic 'no-such-topic' does not exist")
    # A name that would be a query string or a path in a URL is still one name.
    create(url, "plain", "--partitions", "1")
    fails(kraftlog(url, "topics", "describe", "plain?x"),
          "UNKNOWN_TOPIC_OR_PARTITION", "'plain?x' does not exist")
    fails(kraftlog(url, "topics", "describe", "plain#x"), "'plain#x' does not exist")


def test_an_unreachable_broker_is_one_clear_line():
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "--bootstrap", "http://127.0.0.1:9", "topics",
         "list"], capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    fails(result, "cannot reach", "is the node running?")


def test_producing_to_a_dead_bootstrap_fails_at_once_saying_so():
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "--bootstrap", "http://127.0.0.1:9", "produce",
         "orders"], input="a\n", capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
    line = fails(result, "BROKER_NOT_AVAILABLE", "'orders'")
    assert "UNKNOWN_TOPIC" not in line
    assert time.monotonic() - started < 10, "not after a delivery timeout"


# -- produce ------------------------------------------------------------------------------
def test_produced_lines_come_back_in_order(url):
    create(url, "lines", "--partitions", "1")
    lines = [f"line-{i}" for i in range(20)] + ["héllo wörld", "with\ttab", "{\"json\": 1}"]
    result = ok(kraftlog(url, "produce", "lines",
                         stdin="".join(l + "\n" for l in lines[:-1]) + lines[-1] + "\r\n"))
    assert result.stdout == f"Produced {len(lines)} records to lines.\n"

    got = consume(url, "lines", "--from-beginning", "--max-messages", str(len(lines)))
    assert got.stdout.splitlines() == lines
    assert got.stderr == f"Processed a total of {len(lines)} messages\n"


def test_key_separator_splits_keys_and_equal_keys_share_a_partition(url):
    create(url, "keyed", "--partitions", "3")
    produce(url, "keyed", ["user-1:{\"total\":42}", "nokey", "user-2:a:b", "user-1:second",
                           "user-1:third"], "--key-separator", ":")

    got = consume(url, "keyed", "--from-beginning", "--max-messages", "5", "--print-key",
                  "--print-offset").stdout.splitlines()
    records = [line.split("\t") for line in got]
    assert sorted((key, value) for _, key, value in records) == [
        ("null", "nokey"), ("user-1", "second"), ("user-1", "third"),
        ("user-1", "{\"total\":42}"), ("user-2", "a:b")]
    user1 = [(where, value) for where, key, value in records if key == "user-1"]
    partitions = {where.split(":")[0] for where, _ in user1}
    assert len(partitions) == 1  # one key, one partition, in the order sent
    assert [value for _, value in user1] == ["{\"total\":42}", "second", "third"]
    offsets = [int(where.split(":")[1]) for where, _ in user1]
    assert offsets == sorted(offsets)


def test_partition_flag_sends_every_record_to_that_partition(url):
    create(url, "pinned", "--partitions", "3")
    produce(url, "pinned", ["a", "b", "c", "d"], "--partition", "2")

    got = consume(url, "pinned", "--partition", "2", "--offset", "0", "--print-offset",
                  "--max-messages", "4")
    assert got.stdout.splitlines() == ["2:0\ta", "2:1\tb", "2:2\tc", "2:3\td"]
    for p in ("0", "1"):
        empty = consume(url, "pinned", "--partition", p, "--from-beginning",
                        "--timeout-ms", "300")
        assert empty.stdout == ""

    line = fails(kraftlog(url, "produce", "pinned", "--partition", "7",
                          "--delivery-timeout-ms", "1000", stdin="x\n"),
                 "UNKNOWN_TOPIC_OR_PARTITION", "1 of 1 records failed")
    assert "no partition 7" in line


def test_null_value_sends_tombstones_and_consume_prints_them_as_null(url):
    create(url, "tombstones", "--partitions", "1", "--config", "cleanup.policy=Delete,Compact")
    fields, _ = describe(url, "tombstones")["tombstones"]
    assert fields["Configs"] == "cleanup.policy=compact,delete"  # stored canonical
    produce(url, "tombstones", ["user-1:{\"total\":42}", "user-2:null"], "--key-separator", ":")
    # Each line a key: the whole line, or the text before the separator.
    produce(url, "tombstones", ["user-1"], "--null-value")
    produce(url, "tombstones", ["user-2:anything", "user-3"], "--null-value",
            "--key-separator", ":")

    got = consume(url, "tombstones", "--from-beginning", "--max-messages", "5", "--print-key")
    assert got.stdout.splitlines() == ["user-1\t{\"total\":42}", "user-2\tnull",
                                       "user-1\tnull", "user-2\tnull", "user-3\tnull"]
    # The text "null" and a null value are told apart with --null-literal.
    marked = consume(url, "tombstones", "--from-beginning", "--max-messages", "5",
                     "--print-key", "--print-offset", "--null-literal", "<tombstone>")
    assert marked.stdout.splitlines() == [
        "0:0\tuser-1\t{\"total\":42}", "0:1\tuser-2\tnull", "0:2\tuser-1\t<tombstone>",
        "0:3\tuser-2\t<tombstone>", "0:4\tuser-3\t<tombstone>"]


def test_a_compaction_config_the_log_would_refuse_is_refused_at_create(url):
    fails(kraftlog(url, "topics", "create", "badly-compacted", "--config",
                   "cleanup.policy=compress"),
          "INVALID_CONFIG", "cleanup.policy = 'compress' is invalid",
          "delete, compact or compact,delete")
    fails(kraftlog(url, "topics", "create", "badly-compacted", "--config",
                   "min.cleanable.dirty.ratio=1.5"),
          "INVALID_CONFIG", "min.cleanable.dirty.ratio = 1.5 is invalid")
    assert "badly-compacted" not in listed(url)


def test_producing_to_an_unknown_topic_fails_naming_the_error(url):
    started = time.monotonic()
    line = fails(kraftlog(url, "produce", "no-such-topic", "--delivery-timeout-ms", "1000",
                          stdin="a\nb\nc\n"),
                 "UNKNOWN_TOPIC_OR_PARTITION", "no-such-topic", "3 of 3 records failed")
    assert "create it first" in line
    assert time.monotonic() - started < 15  # gave up after the delivery timeout
    assert "no-such-topic" not in listed(url)  # and did not create the topic


# -- consume ------------------------------------------------------------------------------
def test_timeout_ends_a_consumer_when_nothing_arrives(url):
    create(url, "quiet", "--partitions", "2")
    started = time.monotonic()
    got = consume(url, "quiet", "--timeout-ms", "500")
    assert time.monotonic() - started >= 0.5
    assert got.stdout == "" and got.stderr == "Processed a total of 0 messages\n"

    # The timeout counts from the last record: every record is printed first.
    produce(url, "quiet", ["one", "two"], "--partition", "1")
    got = consume(url, "quiet", "--from-beginning", "--timeout-ms", "500")
    assert got.stdout.splitlines() == ["one", "two"]
    assert got.stderr == "Processed a total of 2 messages\n"


def test_consumer_starts_at_the_end_without_from_beginning(url):
    create(url, "tail", "--partitions", "1")
    produce(url, "tail", ["before-0", "before-1", "before-2"])

    consumer = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "--bootstrap", url, "consume", "tail",
         "--max-messages", "3", "--print-offset"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT)
    try:
        # The consumer is ready at some moment we cannot see: keep producing
        # until it has printed three records and exited.
        with Producer(url, linger_ms=0) as producer:
            deadline = time.monotonic() + 20
            i = 0
            while consumer.poll() is None:
                assert time.monotonic() < deadline, "the consumer printed nothing in 20 s"
                producer.send("tail", f"after-{i}".encode()).result(10)
                i += 1
                time.sleep(0.05)
        out, err = consumer.communicate(timeout=10)
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.communicate()
    assert consumer.returncode == 0, err
    records = [line.split("\t") for line in out.splitlines()]
    assert len(records) == 3 and all(value.startswith("after-") for _, value in records)
    offsets = [int(where.split(":")[1]) for where, _ in records]
    assert offsets[0] >= 3 and offsets == list(range(offsets[0], offsets[0] + 3))
    assert err == "Processed a total of 3 messages\n"


def test_offset_and_partition_choose_where_to_start(url):
    create(url, "seek", "--partitions", "2")
    produce(url, "seek", ["a", "b", "c"], "--partition", "0")

    got = consume(url, "seek", "--offset", "1", "--partition", "0", "--max-messages", "2",
                  "--print-offset")
    assert got.stdout.splitlines() == ["0:1\tb", "0:2\tc"]
    assert got.stderr == "Processed a total of 2 messages\n"
    got = consume(url, "seek", "--offset", "earliest", "--partition", "0",
                  "--max-messages", "3")
    assert got.stdout.splitlines() == ["a", "b", "c"]
    got = consume(url, "seek", "--offset", "latest", "--partition", "0", "--timeout-ms", "300")
    assert got.stdout == ""

    fails(kraftlog(url, "consume", "seek", "--offset", "1"),
          "--offset needs --partition")
    fails(kraftlog(url, "consume", "seek", "--offset", "abc", "--partition", "0"),
          "--offset takes a number, 'earliest' or 'latest'", "'abc'")
    fails(kraftlog(url, "consume", "seek", "--offset", "-1", "--partition", "0"),
          "must not be negative")
    fails(kraftlog(url, "consume", "seek", "--partition", "5", "--timeout-ms", "300"),
          "has partitions 0 to 1, not 5")
    # Past the end: said, with the range, not a silent "0 messages".
    fails(kraftlog(url, "consume", "seek", "--partition", "0", "--offset", "999",
                   "--timeout-ms", "300"),
          "OFFSET_OUT_OF_RANGE", "offset 999 of seek-0", "[0, 3]", "auto.offset.reset=latest")
    fails(kraftlog(url, "consume", "no-such-topic", "--timeout-ms", "300"),
          "UNKNOWN_TOPIC_OR_PARTITION", "'no-such-topic'")


def test_help_of_each_console_command_explains_its_flags():
    for command, flags in (
            (["topics", "create"], ["--partitions", "--replication-factor", "--config",
                                    "--if-not-exists"]),
            (["topics", "alter"], ["--partitions", "--replicas", "--config",
                                   "--delete-config"]),
            (["partitions", "reassign"], ["--topic", "--partition", "--replicas",
                                          "--reassignment-json-file", "--cancel"]),
            (["partitions", "reassignments"], ["--topic"]),
            (["partitions", "elect-leaders"], ["--topic", "--partition"]),
            (["produce"], ["--key-separator", "--acks", "--partition", "--linger-ms",
                           "--delivery-timeout-ms"]),
            (["consume"], ["--from-beginning", "--partition", "--offset", "--max-messages",
                           "--timeout-ms", "--print-key", "--print-offset"])):
        result = subprocess.run([sys.executable, "-m", "api.cli", *command, "--help"],
                                capture_output=True, text=True, timeout=30, cwd=REPO_ROOT)
        assert result.returncode == 0, result.stderr
        for flag in flags:
            assert flag in result.stdout, (command, flag)


# -- partitions ---------------------------------------------------------------------------
REASSIGNMENT_COLUMNS = ["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"]


def reassignments(url, *args):
    """``partitions reassignments`` as [row], each a list of cells; [] when none."""
    lines = ok(kraftlog(url, "partitions", "reassignments", *args)).stdout.splitlines()
    if lines == ["No reassignments in progress."]:
        return []
    assert lines[0].split() == REASSIGNMENT_COLUMNS
    return [line.split() for line in lines[1:]]


def test_reassign_refusals_are_one_line(url, tmp_path):
    create(url, "fixed", "--partitions", "2")
    fails(kraftlog(url, "partitions", "reassign", "--topic", "fixed", "--partition", "0"),
          "--replicas 1,2,3")
    fails(kraftlog(url, "partitions", "reassign", "--topic", "fixed", "--replicas", "1"),
          "--topic T --partition P")
    fails(kraftlog(url, "partitions", "reassign", "--topic", "fixed", "--partition", "0",
                   "--replicas", "1;2"), "comma-separated broker ids", "'1;2'")
    fails(kraftlog(url, "partitions", "reassign", "--topic", "fixed", "--partition", "0",
                   "--replicas", "1", "--cancel"), "leave out --replicas")
    fails(kraftlog(url, "partitions", "reassign", "--topic", "fixed", "--partition", "7",
                   "--replicas", "1"), "UNKNOWN_TOPIC_OR_PARTITION", "fixed-7")
    fails(kraftlog(url, "partitions", "reassign", "--topic", "fixed", "--partition", "0",
                   "--replicas", "1,9"), "INVALID_REQUEST", "unregistered brokers [9]")
    fails(kraftlog(url, "partitions", "reassign", "--cancel", "--topic", "fixed",
                   "--partition", "0"), "NO_REASSIGNMENT_IN_PROGRESS", "fixed-0")
    fails(kraftlog(url, "topics", "alter", "fixed", "--replicas", "1:x"), "1:2:3,2:3:1")
    fails(kraftlog(url, "topics", "alter", "fixed", "--replicas", "1", "--partitions", "3"),
          "separate call")
    fails(kraftlog(url, "partitions", "reassign", "--reassignment-json-file",
                   str(tmp_path / "missing.json")), "cannot read")
    bad = tmp_path / "bad.json"
    for text, fragment in (("{", "not valid JSON"), ('{"version": 2, "partitions": []}',
                                                     "must hold a plan like"),
                           ('{"partitions": [{"topic": "fixed", "partition": "0", '
                            '"replicas": [1]}]}', "partitions[0] needs a topic name"),
                           ('{"partitions": [{"topic": "fixed", "partition": 0}]}',
                            "partitions[0] needs replicas")):
        bad.write_text(text)
        fails(kraftlog(url, "partitions", "reassign", "--reassignment-json-file", str(bad)),
              fragment)
    fails(kraftlog(url, "partitions", "reassign", "--reassignment-json-file", str(bad),
                   "--topic", "fixed"), "leave out --topic")
    assert reassignments(url) == []


def test_reassign_to_the_same_broker_and_a_json_plan_on_one_node(url, tmp_path):
    create(url, "planned", "--partitions", "2")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "planned", "partition": 0, "replicas": [1], "log_dirs": ["any"]},
        {"topic": "planned", "partition": 1, "replicas": [1]}]}))
    out = ok(kraftlog(url, "partitions", "reassign", "--reassignment-json-file",
                      str(plan))).stdout
    assert out == ("Reassigning planned-0 to replicas 1.\n"
                   "Reassigning planned-1 to replicas 1.\n")
    assert reassignments(url, "--topic", "planned") == []


def test_elect_leaders_on_one_node_finds_nothing_to_move(url):
    create(url, "led", "--partitions", "2")
    for args in ((), ("--topic", "led"), ("--topic", "led", "--partition", "1")):
        out = ok(kraftlog(url, "partitions", "elect-leaders", *args)).stdout
        assert out == ("No leader election needed: every partition is led by its preferred "
                       "replica.\n")
    fails(kraftlog(url, "partitions", "elect-leaders", "--partition", "0"),
          "--partition needs --topic")
    fails(kraftlog(url, "partitions", "elect-leaders", "--topic", "led", "--partition", "9"),
          "UNKNOWN_TOPIC_OR_PARTITION", "led-9")
    fails(kraftlog(url, "partitions", "elect-leaders", "--topic", "no-such-topic"),
          "UNKNOWN_TOPIC_OR_PARTITION", "no-such-topic")


@pytest.fixture(scope="module")
def brokers3(tmp_path_factory):
    """One controller (node 1) and three brokers (nodes 2, 3, 4)."""
    with ProcessCluster(str(tmp_path_factory.mktemp("partitions")), controllers=1,
                        brokers=3) as cluster:
        cluster.start()
        cluster.wait_for_brokers_running(timeout_s=30)
        yield cluster


def registration(cluster, topic, partition):
    """A partition as the controller's image holds it (GET /v1/metadata)."""
    for entry in cluster.metadata(1)["topics"]:
        if entry["name"] == topic:
            return entry["partitions"][partition]
    raise AssertionError(f"no topic {topic!r} in the metadata")


def test_reassign_moves_a_partition_and_its_records_to_another_broker(brokers3):
    url = brokers3.nodes[2].broker_url
    with Admin(url) as admin:
        admin.create_topics([NewTopic("moved", replica_assignments={0: [2]})])
    produce(url, "moved", ["one", "two", "three"])

    out = ok(kraftlog(url, "partitions", "reassign", "--topic", "moved", "--partition", "0",
                      "--replicas", "3")).stdout
    assert out == "Reassigning moved-0 to replicas 3.\n"
    # Broker 3 copies the log from broker 2, joins the ISR, and takes over.
    wait_until(lambda: registration(brokers3, "moved", 0)["replicas"] == [3], 30,
               "moved-0 on broker 3 alone")
    moved = registration(brokers3, "moved", 0)
    assert (moved["leader"], moved["isr"], moved["adding_replicas"],
            moved["removing_replicas"]) == (3, [3], [], [])
    assert reassignments(url, "--topic", "moved") == []
    got = consume(url, "moved", "--from-beginning", "--max-messages", "3")
    assert got.stdout.splitlines() == ["one", "two", "three"]


def test_a_reassignment_waits_for_its_target_and_can_be_cancelled(brokers3):
    url = brokers3.nodes[2].broker_url
    with Admin(url) as admin:
        admin.create_topics([NewTopic("stuck", replica_assignments={0: [2], 1: [3]})])
    # A stopped target can never catch up: the reassignment stays under way.
    brokers3.pause(4)
    try:
        out = ok(kraftlog(url, "topics", "alter", "stuck", "--replicas", "4,2:3")).stdout
        assert out == ("Reassigning stuck-0 to replicas 4.\n"
                       "Reassigning stuck-1 to replicas 2,3.\n")
        wait_until(lambda: registration(brokers3, "stuck", 1)["replicas"] == [2, 3], 30,
                   "stuck-1 on brokers 2 and 3")
        assert reassignments(url) == [["stuck", "0", "4,2", "4", "2"]]
        assert reassignments(url, "--topic", "moved") == []
        assert registration(brokers3, "stuck", 0)["leader"] == 2

        out = ok(kraftlog(url, "partitions", "reassign", "--cancel", "--topic", "stuck",
                          "--partition", "0")).stdout
        assert out == "Cancelled the reassignment of stuck-0.\n"
        stuck = registration(brokers3, "stuck", 0)
        assert (stuck["replicas"], stuck["isr"], stuck["leader"]) == ([2], [2], 2)
        assert reassignments(url) == []
    finally:
        brokers3.resume(4)
    brokers3.wait_for_brokers_running(timeout_s=30)


def test_elect_leaders_moves_leadership_back_to_the_preferred_replica(brokers3):
    url = brokers3.nodes[3].broker_url  # broker 2 is paused for a while
    with Admin(url) as admin:
        admin.create_topics([NewTopic("preferred", replica_assignments={0: [2, 3]})])
    brokers3.pause(2)  # its lease lapses: broker 3 takes over
    try:
        wait_until(lambda: registration(brokers3, "preferred", 0)["leader"] == 3, 30,
                   "broker 3 leading preferred-0")
    finally:
        brokers3.resume(2)
    wait_until(lambda: sorted(registration(brokers3, "preferred", 0)["isr"]) == [2, 3], 30,
               "broker 2 back in the ISR of preferred-0")

    lines = ok(kraftlog(url, "partitions", "elect-leaders", "--topic", "preferred")
               ).stdout.splitlines()
    assert [line.split() for line in lines] == [
        ["TOPIC", "PARTITION", "LEADER", "PREVIOUS-LEADER"], ["preferred", "0", "2", "3"]]
    assert registration(brokers3, "preferred", 0)["leader"] == 2
    out = ok(kraftlog(url, "partitions", "elect-leaders", "--topic", "preferred")).stdout
    assert out.startswith("No leader election needed")


def test_an_unclean_election_brings_an_offline_partition_back_and_says_what_it_cost(brokers3):
    """Kafka's kafka-leader-election --election-type UNCLEAN: the only ISR
    member is gone, an out-of-sync replica is back; with
    unclean.leader.election.enable off the partition stays offline until an
    operator elects that replica, losing what it lacks (printed)."""
    url = brokers3.nodes[4].broker_url  # not a replica: always up here
    with Admin(url) as admin:
        admin.create_topics([NewTopic("unclean", replica_assignments={0: [2, 3]})])
    produce(url, "unclean", ["a"])  # acks=all: on both
    brokers3.pause(3)  # out of the ISR once its lease lapses
    try:
        wait_until(lambda: registration(brokers3, "unclean", 0)["isr"] == [2], 30,
                   "unclean-0's ISR down to broker 2")
        produce(url, "unclean", ["b", "c"], "--acks", "1")  # broker 2 alone has them
        brokers3.pause(2)  # the last ISR member goes: offline
        wait_until(lambda: registration(brokers3, "unclean", 0)["leader"] == -1, 30,
                   "unclean-0 offline")
        assert registration(brokers3, "unclean", 0)["isr"] == []
        assert registration(brokers3, "unclean", 0)["elr"] == [2]
    finally:
        brokers3.resume(3)
    try:
        wait_until(lambda: brokers3.broker_health(3) and brokers3.broker_health(3).get(
            "state") == "running", 30, "broker 3 running again")
        # Broker 3 is live but not in sync: a clean election cannot pick it.
        assert registration(brokers3, "unclean", 0)["leader"] == -1
        out = ok(kraftlog(url, "partitions", "elect-leaders", "--unclean", "--topic",
                          "unclean")).stdout.splitlines()
        # Broker 2 left the ISR last, emptying it: it is the eligible leader
        # replica (KIP-966) that the unclean election passes over.
        assert [line.split() for line in out[:2]] == [
            ["TOPIC", "PARTITION", "LEADER", "OLD-ISR", "OLD-ELR", "CLEAN", "LOG-END"],
            ["unclean", "0", "3", "-", "2", "NO", "1"]]
        assert "led from outside their ISR" in out[2] and "lost" in out[2]
        assert registration(brokers3, "unclean", 0)["leader"] == 3
        produce(url, "unclean", ["d"])
        again = ok(kraftlog(url, "partitions", "elect-leaders", "--unclean", "--topic",
                            "unclean")).stdout
        assert again.startswith("No leader election needed")
    finally:
        brokers3.resume(2)
    # Broker 2 comes back, drops what the new leader lacks, and follows.
    wait_until(lambda: sorted(registration(brokers3, "unclean", 0)["isr"]) == [2, 3], 60,
               "broker 2 back in unclean-0's ISR")
    got = consume(url, "unclean", "--from-beginning", "--max-messages", "2")
    assert got.stdout.splitlines() == ["a", "d"]


def test_describe_producers_lists_the_idempotent_producers_of_each_partition(url):
    create(url, "producers", "--partitions", "2")
    produce(url, "producers", ["a", "b"], "--partition", "1")
    produce(url, "producers", ["c"], "--partition", "1")
    out = ok(kraftlog(url, "topics", "describe", "producers", "--producers")).stdout
    header, *rows = out.strip().splitlines()
    assert header.split() == ["TOPIC", "PARTITION", "PRODUCER-ID", "EPOCH", "LAST-SEQUENCE",
                              "LAST-OFFSET", "LAST-WRITE"]
    # Two CLI runs: two producers (each process takes its own id), on partition 1 only.
    fields = [row.split() for row in rows]
    assert [(f[0], f[1], f[3]) for f in fields] == [("producers", "1", "0")] * 2
    assert sorted((f[4], f[5]) for f in fields) == [("0", "2"), ("1", "1")]
    assert len({f[2] for f in fields}) == 2
    create(url, "no-producers")
    empty = ok(kraftlog(url, "topics", "describe", "no-producers", "--producers")).stdout
    assert empty == "No idempotent producers have written to no-producers.\n"
