"""The web console in a real browser (Debian's chromium, driven by
Playwright) against a real cluster: three controllers and three brokers.

A user opens http://BROKER/ui/, sees the brokers up, creates a topic,
produces a message and reads it back in the page, watches a consumer
group's lag rise and fall, sees a killed broker marked down and its
partitions' leaders move, and a killed controller disconnected from the
quorum, deletes the topic; bad input (an invalid topic
name, a value that is not JSON, an offset past the end) shows the broker's
error. Screenshots of each page go to ``KRAFTLOG_SCREENSHOTS`` (a folder)
if set, else the test's temporary folder.
"""

from __future__ import annotations

import datetime
import os
import re
import time
import zoneinfo

import pytest

from api.client import Admin, Consumer, Producer, TopicPartition
from bench.console import CHROMIUM, CHROMIUM_ARGS  # the browser, launched as the bench does
from chaos.cluster import FAST_SETTINGS, ProcessCluster
from protocol.partitioner import partition_for_key

WAIT_MS = 20_000
BROWSER_ZONE = "Asia/Kolkata"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ProcessCluster(str(tmp_path_factory.mktemp("console")), controllers=3, brokers=3,
                        settings=dict(FAST_SETTINGS)) as running:
        running.start()
        running.wait_for_active_controller(30)
        running.wait_for_brokers_running(timeout_s=30)
        yield running


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    assert os.path.exists(CHROMIUM), "make test installs Debian's chromium"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, tmp_path):
    # Not the machine's zone (UTC): times typed in the page are the browser's
    # local time, and the test must know which.
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  timezone_id=BROWSER_ZONE)
    opened = context.new_page()
    opened.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    context.close()
    assert errors == [], f"the page's script failed: {errors}"


def shoot(page, tmp_path, name: str) -> None:
    folder = os.environ.get("KRAFTLOG_SCREENSHOTS") or str(tmp_path / "screenshots")
    os.makedirs(folder, exist_ok=True)
    page.screenshot(path=os.path.join(folder, f"{name}.png"), full_page=True)


def test_a_user_creates_produces_reads_watches_and_deletes_in_the_browser(
        cluster, page, tmp_path):
    from playwright.sync_api import expect

    entry = cluster.nodes[cluster.broker_ids[0]]
    base = entry.broker_url
    page.goto(base + "/ui")  # redirected to /ui/
    assert page.url == base + "/ui/"
    for broker in cluster.broker_ids:
        expect(page.locator(f'[data-broker-state="{broker}"]')).to_have_text("up")
    expect(page.locator("#quorum")).to_have_text(re.compile(r"leader \d+, term \d+"))
    # Each broker's disk used, from its log directories (/v1/log-dirs).
    expect(page.locator("#brokers tbody tr td:nth-child(5)")).to_have_text(
        [re.compile(r"^\d+(\.\d)? (B|KB|MB)$")] * 3)
    expect(page.locator("#under-replicated")).to_have_text("0")
    shoot(page, tmp_path, "overview")

    # Topics: an invalid name is refused with the broker's words; then created.
    page.goto(base + "/ui/#/topics")
    page.fill("#new-topic-name", "bad name!")
    page.click("#create-topic button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("INVALID_TOPIC_EXCEPTION")
    page.fill("#new-topic-name", "console-demo")
    page.fill("#new-topic-partitions", "2")
    page.fill("#new-topic-rf", "3")
    page.fill("#new-topic-configs", "retention.ms=3600000")
    page.click("#create-topic button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("created topic console-demo")
    expect(page.locator("#topics")).to_contain_text("console-demo")
    with Admin(base) as admin:
        assert len(admin.describe_topics(["console-demo"])["console-demo"].partitions) == 2
    shoot(page, tmp_path, "topics")

    # The topic's page: its partitions and configs; grown and altered there.
    page.goto(base + "/ui/#/topics/console-demo")
    expect(page.locator("#configs")).to_contain_text("retention.ms")
    page.fill("#config-name", "retention.ms")
    page.fill("#config-value", "7200000")
    page.click("#alter-config button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("retention.ms = 7200000")
    expect(page.locator("#configs")).to_contain_text("7200000")
    page.fill("#config-name", "no.such.config")
    page.fill("#config-value", "1")
    page.click("#alter-config button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("no.such.config")
    page.fill("#partition-count", "3")
    page.click("#add-partitions button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("console-demo has 3 partitions")
    expect(page.locator("#partitions tbody tr")).to_have_count(3)
    # Each follower's lag behind the leader, as the leader sees its fetches.
    expect(page.locator("#partitions tbody tr td:nth-child(10)").first).to_have_text(
        re.compile(r"^\d+: (\d+|not fetching), \d+: (\d+|not fetching)$"))
    with Admin(base) as admin:
        assert len(admin.describe_topics(["console-demo"])["console-demo"].partitions) == 3
        assert admin.describe_configs("console-demo", ["retention.ms"])[
            "retention.ms"].value == "7200000"
    shoot(page, tmp_path, "topic")

    # Produce in the page, and see the record in it.
    page.goto(base + "/ui/#/topics/console-demo/messages")
    page.fill("#produce-key", "order-1")
    page.fill("#produce-value", '{"item": "tea", "id": 9007199254740993}')
    page.click("#produce button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("produced at console-demo-0 offset 0")
    expect(page.locator("#records")).to_contain_text('"item": "tea"')
    expect(page.locator("#records")).to_contain_text("order-1")
    # Pretty, and the integer beyond 2^53 shown as it was written.
    expect(page.locator("#records")).to_contain_text('"id": 9007199254740993')
    # Read from a time: a record made after it, with headers, and not the one before.
    with Consumer(base, auto_offset_reset="earliest", consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition("console-demo", 0)])
        first_ms = next(iter(consumer)).timestamp
    moment_s = first_ms // 1000 + 1
    deadline = time.monotonic() + 5
    while time.time() < moment_s + 0.05 and time.monotonic() < deadline:
        time.sleep(0.05)
    page.fill("#produce-key", "order-2")
    page.fill("#produce-value", '{"item": "cake"}')
    page.fill("#produce-headers", "trace-id: abc-123\nsource: console")
    page.click("#produce button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("produced at console-demo-0 offset 1")
    page.select_option("#from", "timestamp")
    page.fill("#timestamp", datetime.datetime.fromtimestamp(
        moment_s, zoneinfo.ZoneInfo(BROWSER_ZONE)).strftime("%Y-%m-%dT%H:%M:%S"))
    page.click("#read")
    expect(page.locator("#records tbody tr")).to_have_count(1)
    expect(page.locator("#records")).to_contain_text("order-2")
    expect(page.locator("#records")).to_contain_text("trace-id: abc-123")
    # Produced by key: where Kafka's partitioner puts it.
    page.select_option("#produce-partition", "")
    page.fill("#produce-key", "keyed")
    page.fill("#produce-headers", "")
    page.click("#produce button[type=submit]")
    expect(page.locator("#notice")).to_contain_text(
        f"produced at console-demo-{partition_for_key(b'keyed', 3)} offset")
    # The topic list counts them, from the leaders' logs.
    page.goto(base + "/ui/#/topics")
    expect(page.locator('#topics tr:has-text("console-demo") td:nth-child(4)')).to_have_text("3")
    page.goto(base + "/ui/#/topics/console-demo/messages")
    # Not JSON: refused, saying so, and nothing written.
    page.fill("#produce-value", "{oops")
    page.click("#produce button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("the value is not valid JSON")
    # An offset past the end: the broker's error, not a blank page.
    page.select_option("#from", "offset")
    page.fill("#offset", "999")
    page.click("#read")
    expect(page.locator("#notice")).to_contain_text("OFFSET_OUT_OF_RANGE")
    shoot(page, tmp_path, "messages")
    # The page's records are what a client reads.
    with Consumer(base, auto_offset_reset="earliest", consumer_timeout_ms=5000) as consumer:
        consumer.assign([TopicPartition("console-demo", 0)])
        # Stored as typed: no number rounded by the page.
        assert [(r.key, r.value, list(r.headers)) for r in consumer][:2] == [
            (b"order-1", b'{"item": "tea", "id": 9007199254740993}', []),
            (b"order-2", b'{"item": "cake"}', [("trace-id", b"abc-123"), ("source", b"console")])]

    # A consumer group's lag rises as records arrive and falls as it reads.
    with Producer(base, acks="all") as producer:
        for i in range(40):
            producer.send("console-demo", b"v%d" % i, partition=1)
        producer.flush(30_000)
    with Consumer(base, group_id="console-g", auto_offset_reset="earliest",
                  enable_auto_commit=False) as consumer:
        consumer.subscribe(["console-demo"])
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 3 and time.monotonic() < deadline:
            consumer.poll(timeout_ms=200)
        assert len(consumer.assignment()) == 3
        consumer.commit({TopicPartition("console-demo", p): 0 for p in range(3)})
        page.goto(base + "/ui/#/groups/console-g")
        expect(page.locator("#total-lag")).to_have_text("43")
        for p in range(3):  # from the committed offsets, whatever the polls above read
            consumer.seek(TopicPartition("console-demo", p), 0)
        got = 0
        deadline = time.monotonic() + 30
        while got < 43 and time.monotonic() < deadline:
            got += len(consumer.poll(timeout_ms=500))
        assert got == 43
        consumer.commit()
        expect(page.locator("#total-lag")).to_have_text("0")
        # Refused while the group has a member, with the coordinator's reason.
        page.fill("#reset-topic", "console-demo")
        page.select_option("#reset-to", "earliest")
        page.click("#reset button[type=submit]")
        expect(page.locator("#notice")).to_contain_text("NON_EMPTY_GROUP")
    # Empty now: reset to the earliest from the page of a broker that is not
    # the coordinator (it passes the call on).
    other = next(entry_ for bid, entry_ in cluster.nodes.items()
                 if bid in cluster.broker_ids and bid != coordinator_of(base, "console-g"))
    page.goto(other.broker_url + "/ui/#/groups/console-g")
    expect(page.locator("#total-lag")).to_have_text("0")
    page.fill("#reset-topic", "console-demo")
    page.select_option("#reset-to", "shift")
    page.fill("#reset-value", "-5")
    page.click("#reset-preview")
    with Admin(base) as admin:  # a preview changes nothing
        before = admin.list_consumer_group_offsets("console-g")
    assert sum(om.offset for om in before.values()) == 43
    # Each committed offset minus 5, clamped at the log start (0).
    expect(page.locator("#reset-steps tbody tr")).to_have_text([
        re.compile(rf"^\s*{tp.partition}\s*{om.offset}\s*{max(0, om.offset - 5)}\s*$")
        for tp, om in sorted(before.items())])
    # A time that is not ISO 8601 is refused before anything is asked.
    page.select_option("#reset-to", "datetime")
    page.fill("#reset-value", "5")
    page.click("#reset-preview")
    expect(page.locator("#notice")).to_contain_text("is not an ISO 8601 time")
    page.select_option("#reset-to", "earliest")
    page.click("#reset button[type=submit]")
    expect(page.locator("#notice")).to_contain_text("reset 3 offsets of console-g")
    with Admin(base) as admin:
        after = admin.list_consumer_group_offsets("console-g")
    assert {tp.partition: om.offset for tp, om in after.items()} == {0: 0, 1: 0, 2: 0}
    expect(page.locator("#total-lag")).not_to_have_text("0")
    shoot(page, tmp_path, "group")

    # A killed broker is marked down, and its partitions' leaders move.
    with Admin(base) as admin:
        leaders = {p.leader for p in admin.describe_topics(["console-demo"])[
            "console-demo"].partitions}
    victim = next(b for b in cluster.broker_ids if b in leaders and b != entry.node_id) \
        if leaders - {entry.node_id} else next(b for b in cluster.broker_ids
                                               if b != entry.node_id)
    page.goto(base + "/ui/#/")
    cluster.kill(victim)
    try:
        expect(page.locator(f'[data-broker-state="{victim}"]')).to_have_text("down (fenced)")
        # Its replicas leave the ISRs: under-replicated, cluster-wide.
        expect(page.locator("#under-replicated")).not_to_have_text("0", timeout=25_000)
        moved = leaders_moved_away(page, base, victim)
    finally:
        cluster.start([victim])
        cluster.wait_for_brokers_running(timeout_s=30)
    assert moved, f"broker {victim} still leads console-demo's partitions in the page"

    # A controller going down shows in the quorum's table, and coming back.
    leader = quorum_leader(base)
    follower = next(c for c in cluster.controller_ids if c != leader)
    page.goto(base + "/ui/#/")
    expect(page.locator(f'[data-voter="{follower}"]')).to_have_text("yes")
    cluster.kill(follower)
    try:
        expect(page.locator(f'[data-voter="{follower}"]')).to_have_text("no", timeout=WAIT_MS)
    finally:
        cluster.start([follower])
    expect(page.locator(f'[data-voter="{follower}"]')).to_have_text("yes", timeout=WAIT_MS)

    # Deleted in the page, after a confirmation.
    page.goto(base + "/ui/#/topics")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click('[data-delete="console-demo"]')
    expect(page.locator("#notice")).to_contain_text("deleted topic console-demo")
    expect(page.locator("#topics")).not_to_contain_text("console-demo")


def quorum_leader(base: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(base + "/v1/quorum", timeout=10) as answer:
        return json.load(answer)["leader_id"]


def coordinator_of(base: str, group: str) -> int:
    import json
    import urllib.request

    ask = urllib.request.Request(base + "/v1/groups/coordinator", method="POST",
                                 data=json.dumps({"group_id": group}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(ask, timeout=10) as answer:
        return json.load(answer)["coordinator_id"]


def leaders_moved_away(page, base: str, victim: int) -> bool:
    """Whether the topic page shows every partition led, none by ``victim``
    (reloaded until so, within 20 s)."""
    from playwright.sync_api import expect

    page.goto(base + "/ui/#/topics/console-demo")
    leader_cells = page.locator("#partitions tbody tr td:nth-child(2)")
    expect(leader_cells).to_have_count(3)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        page.reload()
        leader_cells.first.wait_for()
        shown = {int(t) for t in leader_cells.all_inner_texts() if re.fullmatch(r"-?\d+", t)}
        if len(shown) and victim not in shown and -1 not in shown:
            return True
        page.wait_for_timeout(500)
    return False


def test_throughput_in_and_out_is_the_whole_clusters(cluster, page, tmp_path):
    # Records produced and fetched through every broker, counted by each and
    # summed by the page: the overview's rates and the topic list's.
    import threading

    from playwright.sync_api import expect

    from api.client import NewTopic

    base = cluster.nodes[cluster.broker_ids[0]].broker_url
    with Admin(base) as admin:
        admin.create_topics([NewTopic("console-busy", 3, 1)])
    stop = threading.Event()

    def load() -> None:  # bounded: stops when the test is done, or after 60 s
        deadline = time.monotonic() + 60
        with Producer(base, acks=1) as producer, Consumer(
                base, auto_offset_reset="earliest", consumer_timeout_ms=100) as consumer:
            consumer.assign([TopicPartition("console-busy", p) for p in range(3)])
            while not stop.is_set() and time.monotonic() < deadline:
                for i in range(20):
                    producer.send("console-busy", b"x", partition=i % 3)
                producer.flush(10_000)
                consumer.poll(timeout_ms=50)
                time.sleep(0.05)

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        page.goto(base + "/ui/#/")
        busy = re.compile(r"^[1-9][\d,]*$")
        expect(page.locator("#rate-in")).to_have_text(busy, timeout=WAIT_MS)
        expect(page.locator("#rate-out")).to_have_text(busy, timeout=WAIT_MS)
        page.goto(base + "/ui/#/topics")
        row = page.locator('#topics tr:has-text("console-busy")')
        expect(row.locator("td:nth-child(6)")).to_have_text(busy, timeout=30_000)
        expect(row.locator("td:nth-child(7)")).to_have_text(busy, timeout=30_000)
        shoot(page, tmp_path, "topics-busy")
    finally:
        stop.set()
        worker.join(30)
    assert not worker.is_alive()


def test_every_page_fits_a_phone_screen(cluster, page, tmp_path):
    # 390 px wide: the page never scrolls sideways (wide tables scroll in
    # their own box), the navigation wraps.
    from playwright.sync_api import expect

    from api.client import NewTopic

    base = cluster.nodes[cluster.broker_ids[0]].broker_url
    with Admin(base) as admin:
        admin.create_topics([NewTopic("console-narrow-with-a-long-name", 2, 3)])
    with Producer(base, acks="all") as producer:
        producer.send("console-narrow-with-a-long-name", b'{"a": "' + b"x" * 300 + b'"}',
                      key=b"k", partition=0)
        producer.flush(10_000)
    page.set_viewport_size({"width": 390, "height": 844})
    for route, shown in (("#/", "#brokers"), ("#/topics", "#topics"),
                         ("#/topics/console-narrow-with-a-long-name", "#partitions"),
                         ("#/topics/console-narrow-with-a-long-name/messages", "#records"),
                         ("#/groups", "#group-list"), ("#/quotas", "main h1")):
        page.goto(f"{base}/ui/{route}")
        expect(page.locator(shown)).to_be_visible()
        width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        assert width[0] <= width[1], (route, width)
    shoot(page, tmp_path, "overview-narrow")


def test_transactions_acls_and_quotas_pages(cluster, page, tmp_path):
    from playwright.sync_api import expect

    from api.client import NewTopic

    base = cluster.nodes[cluster.broker_ids[0]].broker_url
    with Admin(base) as admin:
        admin.create_topics([NewTopic("console-txn-topic", 1, 3)])
        admin.alter_client_quotas({"client-id": "console-client"},
                                  {"producer_byte_rate": 1048576})
    with Producer(base, transactional_id="console-txn", acks="all") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("console-txn-topic", b"in a transaction")
        page.goto(base + "/ui/#/transactions")
        expect(page.locator("#transaction-list")).to_contain_text("console-txn")
        page.click("#transaction-list a")
        expect(page.locator("#transaction")).to_contain_text("Ongoing")
        expect(page.locator("#transaction-partitions")).to_contain_text("console-txn-topic")
        shoot(page, tmp_path, "transaction")
        producer.commit_transaction()
    expect(page.locator("#transaction")).to_contain_text("CompleteCommit")
    expect(page.locator("#transaction")).to_contain_text("Partitions of its last transaction")
    shoot(page, tmp_path, "transactions")

    page.goto(base + "/ui/#/quotas")
    expect(page.locator("#quotas")).to_contain_text("client-id=console-client")
    expect(page.locator("#quotas")).to_contain_text("producer_byte_rate")
    shoot(page, tmp_path, "quotas")
    # No authorizer on this cluster: the ACL page says so, in the broker's words.
    page.goto(base + "/ui/#/acls")
    expect(page.locator("#notice")).to_contain_text("SECURITY_DISABLED")


def test_the_console_serves_its_assets_and_nothing_else(cluster):
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from chaos.cluster import REPO_ROOT

    base = cluster.nodes[cluster.broker_ids[0]].broker_url
    printed = subprocess.run([sys.executable, "-m", "api.cli", "--bootstrap", base, "console"],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and printed.stdout.strip() == base + "/ui/", printed
    with urllib.request.urlopen(base + "/ui/static/console.js", timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("text/javascript")
        assert "default-src 'self'" in answer.headers["Content-Security-Policy"]
        assert b"async function route(" in answer.read()
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(base + "/ui/static/..%2fserver.py", timeout=10)
    assert missing.value.code == 404
    for name in ("nope.js", "console.py"):
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + f"/ui/static/{name}", timeout=10)
        assert missing.value.code == 404


def test_on_a_secure_cluster_the_console_logs_in_and_shows_what_acls_allow(
        browser, tmp_path):
    # SASL_SSL with ACLs: the page loads without credentials (it holds no
    # data), asks for a user's, and then shows only what that user may see.
    from playwright.sync_api import expect

    from api.client import AclBinding, NewTopic
    from protocol import acl

    with ProcessCluster(str(tmp_path / "secure"), controllers=1, brokers=1, tls=True,
                        acls=True, sasl=True, settings=dict(FAST_SETTINGS)) as secure:
        secure.start()
        secure.wait_for_active_controller(30)
        secure.wait_for_brokers_running(timeout_s=30)
        base = secure.nodes[secure.broker_ids[0]].broker_url
        with Admin(base, **secure.client_security) as admin:
            admin.create_topics([NewTopic("shown-topic", 1, 1), NewTopic("hidden-topic", 1, 1)])
        secure.add_user("viewer", "viewer-password", [AclBinding(
            acl.TOPIC, "shown-topic", acl.LITERAL, "User:viewer", acl.WILDCARD, acl.DESCRIBE,
            acl.ALLOW)])
        secure.add_user("operator", "operator-password", [AclBinding(
            acl.CLUSTER, acl.CLUSTER_NAME, acl.LITERAL, "User:operator", acl.WILDCARD, op,
            acl.ALLOW) for op in (acl.ALTER, acl.DESCRIBE)])
        context = browser.new_context(ignore_https_errors=True)  # the cluster's own CA
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(base + "/ui/#/topics")
            expect(page.locator("#notice")).to_contain_text("SASL_AUTHENTICATION_FAILED")
            page.fill("#login-user", "viewer")
            page.fill("#login-password", "wrong")
            page.click("#login button[type=submit]")
            expect(page.locator("#login")).to_be_visible()  # asked again
            page.fill("#login-user", "viewer")
            page.fill("#login-password", "viewer-password")
            page.click("#login button[type=submit]")
            expect(page.locator("#topics")).to_contain_text("shown-topic")
            expect(page.locator("#topics")).not_to_contain_text("hidden-topic")
            shoot(page, tmp_path, "secure-topics")
            page.goto(base + "/ui/#/topics/hidden-topic")
            expect(page.locator("#notice")).to_contain_text("TOPIC_AUTHORIZATION_FAILED")
            page.goto(base + "/ui/#/acls")
            expect(page.locator("#notice")).to_contain_text("CLUSTER_AUTHORIZATION_FAILED")
            # Log out; an operator allowed to manage ACLs logs in and does.
            page.click("#logout")
            expect(page.locator("#login")).to_be_visible()
            expect(page.locator("#logout")).to_be_hidden()
            page.fill("#login-user", "operator")
            page.fill("#login-password", "operator-password")
            page.click("#login button[type=submit]")
            expect(page.locator("#acls")).to_contain_text("User:viewer")
            page.select_option("#acl-resource-type", "GROUP")
            page.fill("#acl-resource-name", "viewers-")
            page.select_option("#acl-pattern-type", "PREFIXED")
            page.fill("#acl-principal", "User:viewer")
            page.select_option("#acl-operation", "READ")
            page.click("#create-acl button[type=submit]")
            expect(page.locator("#notice")).to_contain_text("ACL created")
            expect(page.locator("#acls")).to_contain_text("viewers-")
            shoot(page, tmp_path, "acls")
            made = acl.AclBinding(acl.GROUP, "viewers-", acl.PREFIXED, "User:viewer",
                                  acl.WILDCARD, acl.READ, acl.ALLOW)
            with Admin(base, **secure.client_security) as admin:
                assert made in admin.describe_acls()
            page.fill("#acl-principal", "nobody")  # not a principal: the broker says why
            page.click("#create-acl button[type=submit]")
            expect(page.locator("#notice")).to_contain_text("INVALID_REQUEST")
            page.once("dialog", lambda dialog: dialog.accept())
            page.click('[data-delete-acl="User:viewer READ GROUP:viewers-"]')
            expect(page.locator("#notice")).to_contain_text("ACL deleted")
            expect(page.locator("#acls")).not_to_contain_text("viewers-")
            with Admin(base, **secure.client_security) as admin:
                assert made not in admin.describe_acls()
            # A delegation token logs in as its owner; a wrong one is asked again.
            with Admin(base, **secure.user_security("viewer", "viewer-password")) as viewer:
                token = viewer.create_delegation_token()
            page.click("#logout")
            page.fill("#login-token", token.value + "x")
            page.click("#login-with-token button[type=submit]")
            expect(page.locator("#notice")).to_contain_text("SASL_AUTHENTICATION_FAILED")
            page.fill("#login-token", token.value)
            page.click("#login-with-token button[type=submit]")
            page.goto(base + "/ui/#/topics")
            expect(page.locator("#topics")).to_contain_text("shown-topic")
            expect(page.locator("#topics")).not_to_contain_text("hidden-topic")
        finally:
            context.close()
        # A browser holding the administrator's client certificate needs no
        # login: the TLS handshake names it, and it sees every topic.
        context = browser.new_context(ignore_https_errors=True, client_certificates=[{
            "origin": base, "certPath": secure.certs["client"].certfile,
            "keyPath": secure.certs["client"].keyfile}])
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        try:
            page.goto(base + "/ui/#/topics")
            expect(page.locator("#topics")).to_contain_text("hidden-topic")
            expect(page.locator("#login")).to_have_count(0)
        finally:
            context.close()
        # Only the console's own routes are open without credentials: a path
        # that only looks like one of them gets nothing.
        import ssl
        import urllib.error
        import urllib.request
        trust = ssl.create_default_context(cafile=secure.certs["ca"].certfile)
        with urllib.request.urlopen(base + "/ui/static/console.js", context=trust,
                                    timeout=10) as answer:
            assert answer.status == 200
        for sneaky in ("/ui/static/%2e%2e/%2e%2e/v1/topics", "/ui/static/..%2f..%2fv1/topics",
                       "/ui/static/../../v1/topics", "/ui/../v1/topics", "/v1/topics"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + sneaky, context=trust, timeout=10)
            assert refused.value.code in (401, 404), (sneaky, refused.value.code)
