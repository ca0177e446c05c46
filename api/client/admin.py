"""Administration: topics, partitions, configs, leader elections,
partition reassignments, consumer group offsets, transactions, cluster.

Any broker accepts the admin calls and forwards them to the active
controller; it answers once its own metadata shows the change, so a produce
right after ``create_topics`` finds the topic (docs/protocol.md, Admin).

Per-topic outcomes follow Kafka's admin client, where each topic has its own
future: ``create_topics``, ``delete_topics`` and ``create_partitions`` return
a dict of every topic's outcome and, by default (``raise_on_error=True``),
raise the first topic's error after the call completed for all of them (the
others were still applied). Pass ``raise_on_error=False`` to inspect each.
``elect_leaders`` never raises per partition: "already led by the preferred
replica" and similar answers are normal there. ``alter_partition_reassignments``
answers per partition like the topic calls.

A call is retried, until ``request_timeout_ms``, only while no controller is
active (``NOT_CONTROLLER``) or no broker answers at all; other errors are the
caller's to see at once (a timed-out create is not blindly repeated).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from api.client._sync import LoopThread
from api.client._transport import (DEFAULT_BOOTSTRAP, ClusterMetadata, Security, Transport,
                                   default_client_id, monotonic_ms)
from api.client._types import (ConfigEntry, NewTopic, OffsetAndMetadata, PartitionInfo,
                               PartitionReassignment, PreparedTransaction, TopicDescription,
                               TopicPartition, as_topic_partition)
from api.client.errors import KraftlogError, UnknownTopicOrPartitionError, error_from
from protocol.acl import AclBinding, AclBindingFilter

#: Codes after which an admin call is tried again (nothing was applied).
#: A group's coordinator is being created, is loading, or moved: ask again.
#: A coordinator that does not answer (killed, restarting) is replaced by
#: another broker within a failover: ask again too.
#: Ask the group coordinator again after these: it moved or is loading, or
#: the offsets log could not be written to enough replicas yet (a broker
#: down; Kafka's coordinator answers COORDINATOR_NOT_AVAILABLE then). Writing
#: the same offsets again is harmless.
COORDINATOR_RETRY_CODES = frozenset({"COORDINATOR_NOT_AVAILABLE",
                                     "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR",
                                     "BROKER_NOT_AVAILABLE", "REQUEST_TIMED_OUT",
                                     "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND"})
ADMIN_RETRY_CODES = frozenset({"NOT_CONTROLLER", "BROKER_NOT_AVAILABLE"})
#: Ending a prepared transaction: ask the coordinator again after these (it
#: moved, is loading, or is still writing the markers of the decision).
TXN_RETRY_CODES = COORDINATOR_RETRY_CODES | frozenset({
    "BROKER_NOT_AVAILABLE", "CONCURRENT_TRANSACTIONS", "REQUEST_TIMED_OUT",
    "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_LEADER_OR_FOLLOWER",
    "UNKNOWN_TOPIC_OR_PARTITION", "LEADER_NOT_AVAILABLE", "KAFKA_STORAGE_ERROR"})


class CreatedTopic(NamedTuple):
    """The outcome of creating one topic; ``error`` None on success."""

    name: str
    topic_id: str | None
    num_partitions: int
    replication_factor: int
    configs: dict[str, Any]
    error: KraftlogError | None


class DelegationToken(NamedTuple):
    """A delegation token (Kafka's): who it authenticates as, until when,
    and its HMAC. ``value`` is what a client presents
    (``sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=token.value``)."""

    token_id: str
    hmac: str
    owner: str
    renewers: tuple[str, ...]
    issue_timestamp_ms: int
    expiration_timestamp_ms: int
    max_timestamp_ms: int

    @property
    def value(self) -> str:
        return f"{self.token_id}.{self.hmac}"

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> "DelegationToken":
        return cls(raw["token_id"], raw["hmac"], raw["owner"], tuple(raw.get("renewers") or ()),
                   raw["issue_timestamp_ms"], raw["expiration_timestamp_ms"],
                   raw["max_timestamp_ms"])


def _new_topic_body(topic: NewTopic | str) -> dict:
    if isinstance(topic, str):
        topic = NewTopic(topic)
    if not isinstance(topic, NewTopic):
        raise TypeError(f"expected NewTopic or a topic name, not {topic!r}")
    body: dict[str, Any] = {"name": topic.name, "num_partitions": topic.num_partitions,
                            "replication_factor": topic.replication_factor,
                            "configs": dict(topic.configs)}
    if topic.replica_assignments is not None:
        body["assignments"] = {int(p): list(replicas)
                               for p, replicas in topic.replica_assignments.items()}
    return body


def _configs_dict(configs: Any) -> dict[str, Any]:
    """Topic configs as name -> value, from a map or ``[{"name", "value"}]``."""
    if isinstance(configs, Mapping):
        return dict(configs)
    return {c["name"]: c.get("value") for c in configs or ()}


def _config_entries(configs: Any) -> dict[str, ConfigEntry]:
    """``[{"name", "value", "source"}]`` (or a map of overrides) as entries."""
    if isinstance(configs, Mapping):
        return {k: ConfigEntry(k, v, "TOPIC_CONFIG") for k, v in configs.items()}
    return {c["name"]: ConfigEntry(c["name"], c.get("value"), c.get("source"))
            for c in configs or ()}


def _raise_first(results: Mapping[Any, Any], raise_on_error: bool) -> None:
    if not raise_on_error:
        return
    for outcome in results.values():
        error = outcome.error if isinstance(outcome, CreatedTopic) else outcome
        if error is not None:
            raise error


class AsyncAdmin:
    """The asyncio admin client. ``bootstrap``: a broker URL, "a,b" or a
    list; ``request_timeout_ms`` bounds each call, retries included."""

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, *,
                 request_timeout_ms: int = 30_000, retry_backoff_ms: int = 100,
                 security_protocol: str = "PLAINTEXT", ssl_cafile: str | None = None,
                 ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 ssl_check_hostname: bool = True, client_id: str | None = None,
                 sasl_mechanism: str | None = None, sasl_plain_username: str | None = None,
                 sasl_plain_password: str | None = None,
                 sasl_oauth_token_provider: Any = None) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._transport = Transport(
            request_timeout_ms=request_timeout_ms,
            security=Security(security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile,
                              ssl_check_hostname, sasl_mechanism, sasl_plain_username,
                              sasl_plain_password, sasl_oauth_token_provider),
            client_id=default_client_id("adminclient") if client_id is None else client_id)
        self._metadata = ClusterMetadata(self._transport, bootstrap,
                                         request_timeout_ms=request_timeout_ms)

    async def __aenter__(self) -> "AsyncAdmin":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    async def _call(self, path: str, body: Any = None, *, method: str = "POST") -> Any:
        deadline_ms = monotonic_ms() + self.request_timeout_ms
        while True:
            try:
                return await self._metadata.request_any(
                    path, body, method=method, retry_timeouts=(method == "GET"))
            except KraftlogError as exc:
                wait_ms = min(self.retry_backoff_ms, deadline_ms - monotonic_ms())
                if exc.code not in ADMIN_RETRY_CODES or wait_ms <= 0:
                    raise
                await asyncio.sleep(wait_ms / 1000)

    # -- topics -------------------------------------------------------------------
    async def create_topics(self, new_topics: Iterable[NewTopic | str], *,
                            validate_only: bool = False, raise_on_error: bool = True
                            ) -> dict[str, CreatedTopic]:
        """Create topics (``NewTopic`` or plain names, which take the
        cluster's defaults). ``validate_only`` checks without creating."""
        topics = [_new_topic_body(t) for t in new_topics]
        answer = await self._call("/v1/admin/topics/create",
                                  {"topics": topics, "validate_only": validate_only})
        results = {}
        for entry in answer.get("topics") or ():
            results[entry["name"]] = CreatedTopic(
                entry["name"], entry.get("topic_id"), entry.get("num_partitions", -1),
                entry.get("replication_factor", -1), _configs_dict(entry.get("configs")),
                error_from(entry.get("error")))
        _raise_first(results, raise_on_error)
        return results

    async def delete_topics(self, names: Iterable[str], *, raise_on_error: bool = True
                            ) -> dict[str, KraftlogError | None]:
        answer = await self._call("/v1/admin/topics/delete", {"topics": list(names)})
        results = {entry["name"]: error_from(entry.get("error"))
                   for entry in answer.get("topics") or ()}
        _raise_first(results, raise_on_error)
        return results

    async def describe_topics(self, names: Iterable[str] | None = None
                              ) -> dict[str, TopicDescription]:
        """Partitions (leader, epoch, replicas, ISR) and configs (each a
        ``ConfigEntry`` with its source) of ``names`` (every topic for None).
        An unknown topic raises."""
        answer = await self._call("/v1/admin/topics/describe",
                                  {"topics": None if names is None else list(names)})
        out = {}
        for topic in answer.get("topics") or ():
            error = error_from(topic.get("error"))
            if error is not None:
                raise error
            partitions = [PartitionInfo(p["partition"], p.get("leader", -1),
                                        p.get("leader_epoch", -1), list(p.get("replicas", ())),
                                        list(p.get("isr", ())), tuple(p.get("elr", ())),
                                        p.get("last_known_leader", -1))
                          for p in topic.get("partitions") or ()]
            out[topic["name"]] = TopicDescription(
                topic["name"], topic.get("topic_id"), partitions,
                _config_entries(topic.get("configs")))
        return out

    async def list_topics(self) -> list[str]:
        """The names of every topic, sorted."""
        answer = await self._call("/v1/metadata", {"topics": None})
        return sorted(t["name"] for t in answer.get("topics") or () if t.get("error") is None)

    async def create_partitions(self, counts: Mapping[str, int], *,
                                validate_only: bool = False, raise_on_error: bool = True
                                ) -> dict[str, KraftlogError | None]:
        """Grow each topic to ``count`` partitions (never shrinks)."""
        answer = await self._call("/v1/admin/partitions/create", {
            "topics": [{"name": name, "count": count} for name, count in counts.items()],
            "validate_only": validate_only})
        results = {entry["name"]: error_from(entry.get("error"))
                   for entry in answer.get("topics") or ()}
        _raise_first(results, raise_on_error)
        return results

    # -- configs ----------------------------------------------------------------------
    async def describe_configs(self, topic: str, keys: Iterable[str] | None = None
                               ) -> dict[str, ConfigEntry]:
        """Every config of ``topic`` (or only ``keys``) with its value and
        where the value comes from (the topic's override or a default)."""
        resource: dict[str, Any] = {"type": "topic", "name": topic}
        if keys is not None:
            resource["keys"] = list(keys)
        answer = await self._call("/v1/admin/configs/describe", {"resources": [resource]})
        for entry in answer.get("resources") or ():
            error = error_from(entry.get("error"))
            if error is not None:
                raise error
            return _config_entries(entry.get("configs"))
        raise UnknownTopicOrPartitionError(f"no configs answered for topic {topic!r}")

    # -- SCRAM users --------------------------------------------------------------
    async def upsert_user(self, name: str, password: str, *,
                          mechanism: str = "SCRAM-SHA-512", iterations: int = 8192) -> None:
        """Create ``name`` or replace its password (Kafka's
        AlterUserScramCredentials; a user has one password, so a credential
        of another mechanism goes). The password is salted and iterated
        here; only that travels, and the cluster keeps only keys derived
        from it."""
        from protocol import scram
        try:
            scram.check_user_name(name)
            scram.check_mechanism(mechanism)
            scram.check_iterations(iterations)
        except ValueError as exc:
            raise KraftlogError("INVALID_REQUEST", str(exc)) from None
        salt = scram.new_salt()
        salted = scram.salted_password(password, salt, iterations, mechanism)
        await self._alter_users({"upsertions": [{
            "name": name, "mechanism": mechanism, "iterations": iterations, "salt": salt,
            "salted_password": salted}]})

    async def delete_user(self, name: str, *, mechanism: str | None = None) -> None:
        """Remove ``name`` (only its ``mechanism`` credential, if given)."""
        deletion = {"name": name} if mechanism is None else {"name": name,
                                                             "mechanism": mechanism}
        await self._alter_users({"deletions": [deletion]})

    async def _alter_users(self, body: dict) -> None:
        answer = await self._call("/v1/admin/users/alter", body)
        for entry in answer.get("results") or ():
            error = error_from(entry.get("error"))
            if error is not None:
                raise error

    async def describe_users(self) -> dict[str, dict[str, int]]:
        """User -> mechanism -> iterations (no salt or key ever leaves the cluster)."""
        answer = await self._call("/v1/admin/users/describe", {})
        return {user["name"]: {c["mechanism"]: c["iterations"] for c in user["credentials"]}
                for user in answer.get("users") or ()}

    # -- delegation tokens ----------------------------------------------------------
    async def create_delegation_token(self, renewers: Iterable[str] = (), *,
                                      max_lifetime_ms: int = -1) -> "DelegationToken":
        """A token that authenticates as this client's user (Kafka's
        CreateDelegationToken); ``renewers`` (principals) may renew it too.
        Its ``value`` goes to ``sasl_oauth_token_provider``."""
        if isinstance(renewers, str):  # one principal, not its characters
            renewers = [renewers]
        answer = await self._call("/v1/admin/tokens/create", {
            "renewers": list(renewers), "max_lifetime_ms": max_lifetime_ms})
        return DelegationToken.from_wire(answer["token"])

    async def renew_delegation_token(self, token: "DelegationToken", *,
                                     renew_period_ms: int = -1) -> int:
        """Push the token's expiry back (by the cluster's
        delegation.token.expiry.time.ms by default); its new expiry."""
        answer = await self._call("/v1/admin/tokens/renew", {
            "token_id": token.token_id, "hmac": token.hmac, "renew_period_ms": renew_period_ms})
        return answer["expiration_timestamp_ms"]

    async def expire_delegation_token(self, token: "DelegationToken", *,
                                      expiry_period_ms: int = -1) -> int:
        """Expire the token now (or in ``expiry_period_ms``); its expiry."""
        answer = await self._call("/v1/admin/tokens/expire", {
            "token_id": token.token_id, "hmac": token.hmac,
            "expiry_period_ms": expiry_period_ms})
        return answer["expiration_timestamp_ms"]

    async def describe_delegation_token(self, owners: Iterable[str] | None = None
                                        ) -> list["DelegationToken"]:
        """The tokens this user owns or may renew (of ``owners``, if given)."""
        answer = await self._call("/v1/admin/tokens/describe", {
            "owners": None if owners is None else list(owners)})
        return [DelegationToken.from_wire(t) for t in answer.get("tokens") or ()]

    # -- ACLs ---------------------------------------------------------------------
    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Create ACLs (``AclBinding``); one already there is kept as it is.
        Raises the first refusal (an invalid binding: ``INVALID_REQUEST``)."""
        answer = await self._call("/v1/admin/acls/create", {
            "creations": [b.to_wire() for b in bindings]})
        for entry in answer.get("results") or ():
            error = error_from(entry.get("error"))
            if error is not None:
                raise error

    async def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[AclBinding]:
        """Delete every ACL a filter matches; the ACLs deleted."""
        answer = await self._call("/v1/admin/acls/delete", {
            "filters": [f.to_wire() for f in filters]})
        deleted: set[AclBinding] = set()
        for entry in answer.get("filter_results") or ():
            error = error_from(entry.get("error"))
            if error is not None:
                raise error
            deleted.update(AclBinding(**b) for b in entry.get("matching_acls") or ())
        return sorted(deleted)

    async def describe_acls(self, acl_filter: AclBindingFilter = AclBindingFilter()
                            ) -> list[AclBinding]:
        """The ACLs ``acl_filter`` matches (by default: all)."""
        answer = await self._call("/v1/admin/acls/describe", {"filter": acl_filter.to_wire()})
        return [AclBinding(**b) for b in answer.get("acls") or ()]

    # -- client quotas ------------------------------------------------------------
    async def alter_client_quotas(self, entity: Mapping[str, str],
                                  quotas: Mapping[str, float | None], *,
                                  validate_only: bool = False) -> None:
        """Set quotas of ``entity`` (``{"user": ..., "client-id": ...}``,
        either or both, a value ``"<default>"`` for every one without its
        own): ``{"producer_byte_rate": 1e6}``; a value of None removes it."""
        answer = await self._call("/v1/admin/quotas/alter", {
            "entries": [{"entity": dict(entity), "ops": [
                {"key": key, "value": value} for key, value in quotas.items()]}],
            "validate_only": validate_only})
        for entry in answer.get("entries") or ():
            error = error_from(entry.get("error"))
            if error is not None:
                raise error

    async def describe_client_quotas(self) -> list[tuple[dict[str, str], dict[str, float]]]:
        """Every entity with a quota, and its quotas."""
        answer = await self._call("/v1/admin/quotas/describe", {})
        return [(dict(entry["entity"]), dict(entry["quotas"]))
                for entry in answer.get("entries") or ()]

    async def alter_configs(self, topic: str, changes: Mapping[str, Any], *,
                            validate_only: bool = False) -> None:
        """Set configs of ``topic``; a value of None deletes the override
        (back to the default). Keys not named keep their values."""
        ops = [{"name": key, "op": "delete"} if value is None
               else {"name": key, "op": "set", "value": value}
               for key, value in changes.items()]
        answer = await self._call("/v1/admin/configs/alter", {
            "resources": [{"type": "topic", "name": topic, "ops": ops}],
            "validate_only": validate_only})
        for entry in answer.get("resources") or ():
            error = error_from(entry.get("error"))
            if error is not None:
                raise error

    # -- partitions and cluster ----------------------------------------------------------
    async def elect_leaders(self, partitions: Iterable[Any] | None = None,
                            election_type: str = "preferred"
                            ) -> dict[TopicPartition, KraftlogError | None]:
        """``election_type`` "preferred": move leadership to each partition's
        preferred (first) replica. "unclean": give each partition that has
        no leader one, from outside the ISR if no ISR member is live
        (accepting the loss of what it lacks; ``ELECTION_NOT_NEEDED`` for
        one that has a leader). All partitions for None (then only those
        that changed or could not are answered). Per-partition errors are
        returned, not raised."""
        body = {"election_type": election_type, "partitions": None if partitions is None else [
            {"topic": tp.topic, "partition": tp.partition}
            for tp in map(as_topic_partition, partitions)]}
        answer = await self._call("/v1/admin/leaders/elect", body)
        return {TopicPartition(e["topic"], e["partition"]): error_from(e.get("error"))
                for e in answer.get("partitions") or ()}

    async def alter_partition_reassignments(
            self, reassignments: Mapping[Any, list[int] | None], *,
            raise_on_error: bool = True) -> dict[TopicPartition, KraftlogError | None]:
        """Move partitions to new replicas: ``{(topic, partition): [broker
        ids]}``, the first the preferred leader. A list replaces any
        reassignment under way; None cancels it. The call returns once the
        reassignments have started: new replicas then copy the log, and a
        reassignment completes when they are all in sync
        (``list_partition_reassignments`` shows those still under way)."""
        partitions = []
        for tp, replicas in reassignments.items():
            tp = as_topic_partition(tp)
            partitions.append({"topic": tp.topic, "partition": tp.partition,
                               "replicas": None if replicas is None else list(replicas)})
        answer = await self._call("/v1/admin/partitions/reassign", {"partitions": partitions})
        results = {TopicPartition(e["topic"], e["partition"]): error_from(e.get("error"))
                   for e in answer.get("partitions") or ()}
        _raise_first(results, raise_on_error)
        return results

    async def list_partition_reassignments(self, topics: Iterable[str] | None = None
                                           ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments under way, of ``topics`` (every topic for
        None); partitions with none are left out."""
        answer = await self._call("/v1/admin/partitions/reassignments",
                                  {"topics": None if topics is None else list(topics)})
        return {TopicPartition(e["topic"], e["partition"]): PartitionReassignment(
                    list(e.get("replicas", ())), list(e.get("adding_replicas", ())),
                    list(e.get("removing_replicas", ())))
                for e in answer.get("partitions") or ()}

    # -- consumer groups ------------------------------------------------------------
    async def _coordinator_call(self, group_id: str, path: str, body: dict) -> Any:
        """POST ``body`` to the coordinator of ``group_id`` (found through
        any broker), finding it again while it moves, loads or is created,
        within ``request_timeout_ms``."""
        deadline_ms = monotonic_ms() + self.request_timeout_ms
        while True:
            try:
                where = await self._call("/v1/groups/coordinator", {"group_id": group_id})
                return await self._transport.request(where["coordinator_url"], path, body)
            except KraftlogError as exc:
                wait_ms = min(self.retry_backoff_ms, deadline_ms - monotonic_ms())
                if exc.code not in COORDINATOR_RETRY_CODES or wait_ms <= 0:
                    raise
                await asyncio.sleep(wait_ms / 1000)

    async def delete_consumer_groups(self, group_ids: Iterable[str]) -> None:
        """Delete each (empty) group and its committed offsets (Kafka's
        ``deleteConsumerGroups``); raises ``NON_EMPTY_GROUP`` for a group
        with members, ``GROUP_ID_NOT_FOUND`` for an unknown one."""
        for group_id in group_ids:
            await self._coordinator_call(group_id, "/v1/admin/groups/delete",
                                         {"group_id": group_id})

    async def alter_consumer_group_offsets(self, group_id: str,
                                           offsets: Mapping[Any, int | OffsetAndMetadata]
                                           ) -> None:
        """Set the committed offsets of an empty group (Kafka's
        ``alterConsumerGroupOffsets``): ``{TopicPartition: offset}``, or
        ``OffsetAndMetadata`` values to commit a string with an offset. The
        offsets of one call are written together, in one record batch."""
        entries = []
        for tp, value in sorted(offsets.items()):
            value = value if isinstance(value, OffsetAndMetadata) else OffsetAndMetadata(value)
            entries.append({"topic": tp[0], "partition": tp[1], "offset": value.offset,
                            "metadata": value.metadata})
        await self._coordinator_call(group_id, "/v1/admin/groups/offsets/reset", {
            "group_id": group_id, "offsets": entries})

    async def list_consumer_group_offsets(self, group_id: str
                                          ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Every committed offset of ``group_id``, with its metadata
        (Kafka's ``listConsumerGroupOffsets``); empty for an unknown group."""
        answer = await self._coordinator_call(group_id, "/v1/groups/offsets/fetch",
                                              {"group_id": group_id})
        return {TopicPartition(e["topic"], e["partition"]):
                OffsetAndMetadata(e["offset"], e.get("metadata") or "")
                for e in answer.get("partitions") or ()}

    # -- transactions ---------------------------------------------------------------
    async def list_transactions(self) -> list[dict]:
        """Every transactional id of the cluster: ``transactional_id``,
        ``producer_id``, ``state`` (Kafka's ``listTransactions``)."""
        answer = await self._call("/v1/transactions", method="GET")
        return list(answer.get("transactions") or ())

    async def _txn_call(self, path: str, body: Any = None, *, method: str = "POST") -> Any:
        """``path`` on any broker, which asks the id's coordinator; asked
        again while the coordinator moves or loads (``TXN_RETRY_CODES``)."""
        deadline_ms = monotonic_ms() + self.request_timeout_ms
        while True:
            try:
                return await self._call(path, body, method=method)
            except KraftlogError as exc:
                wait_ms = min(self.retry_backoff_ms, deadline_ms - monotonic_ms())
                if exc.code not in TXN_RETRY_CODES - {"CONCURRENT_TRANSACTIONS"} \
                        or wait_ms <= 0:
                    raise
                await asyncio.sleep(wait_ms / 1000)

    async def describe_transaction(self, transactional_id: str) -> dict | None:
        """One transactional id as its coordinator knows it (producer id and
        epoch, state, partitions, timeout); None if it does not exist."""
        from urllib.parse import quote
        try:
            return await self._txn_call(
                "/v1/transactions?transactional_id=" + quote(transactional_id, safe=""),
                method="GET")
        except KraftlogError as exc:
            if exc.code == "TRANSACTIONAL_ID_NOT_FOUND":
                return None
            raise

    async def abort_transaction(self, transactional_id: str) -> None:
        """Abort the id's open transaction, as its timeout would (the producer
        that left it is fenced); raises ``INVALID_TXN_STATE`` if none is open."""
        await self._txn_call("/v1/admin/transactions/abort",
                             {"transactional_id": transactional_id})

    async def complete_transaction(self, prepared: PreparedTransaction, commit: bool = True,
                                   timeout_ms: int | None = None) -> None:
        """KIP-939's second phase: commit (or abort) a transaction another
        process left prepared (``Producer.prepare_transaction``), and return
        once its markers are written. Repeating it is harmless: a
        transaction already completed the same way answers at once.
        Raises ``PRODUCER_FENCED`` if the id has moved on (a newer instance
        took it, or it was aborted), ``INVALID_TXN_STATE`` if it was decided
        the other way. Retries within ``timeout_ms`` (default: twice
        ``request_timeout_ms``) while the coordinator moves or loads."""
        deadline = monotonic_ms() + (timeout_ms or 2 * self.request_timeout_ms)
        body = {"transactional_id": prepared.transactional_id,
                "producer_id": prepared.producer_id, "producer_epoch": prepared.producer_epoch,
                "committed": bool(commit)}
        decided = False
        while True:
            try:
                where = await self._call("/v1/transactions/coordinator",
                                         {"transactional_id": prepared.transactional_id})
                url = where.get("coordinator_url")
                if url is None:
                    raise KraftlogError("COORDINATOR_NOT_AVAILABLE",
                                        "the coordinator has no address yet", retriable=True)
                await self._transport.request(url, "/v1/transactions/end", body)
                if decided:
                    return  # the second answer comes once the markers are in
                decided = True
                continue
            except KraftlogError as exc:
                wait_ms = min(self.retry_backoff_ms, deadline - monotonic_ms())
                if exc.code not in TXN_RETRY_CODES or wait_ms <= 0:
                    raise
            await asyncio.sleep(wait_ms / 1000)

    async def describe_cluster(self) -> dict:
        """The cluster id, the active controller and the brokers
        (``GET /v1/cluster``)."""
        return await self._call("/v1/cluster", method="GET")


class Admin:
    """The synchronous admin client: ``AsyncAdmin``'s methods, blocking.

    ::

        with Admin(bootstrap=url) as admin:
            admin.create_topics([NewTopic("orders", num_partitions=6)])
    """

    def __init__(self, bootstrap: str | Iterable[str] = DEFAULT_BOOTSTRAP, **settings: Any
                 ) -> None:
        self._thread = LoopThread("kraftlog-admin")
        self._admin = AsyncAdmin(bootstrap, **settings)
        self._closed = False

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def create_topics(self, new_topics: Iterable[NewTopic | str], **kwargs: Any
                      ) -> dict[str, CreatedTopic]:
        return self._thread.run(self._admin.create_topics(list(new_topics), **kwargs))

    def delete_topics(self, names: Iterable[str], **kwargs: Any
                      ) -> dict[str, KraftlogError | None]:
        return self._thread.run(self._admin.delete_topics(list(names), **kwargs))

    def upsert_user(self, name: str, password: str, **kwargs: Any) -> None:
        return self._thread.run(self._admin.upsert_user(name, password, **kwargs))

    def delete_user(self, name: str, **kwargs: Any) -> None:
        return self._thread.run(self._admin.delete_user(name, **kwargs))

    def describe_users(self) -> dict[str, dict[str, int]]:
        return self._thread.run(self._admin.describe_users())

    def create_delegation_token(self, renewers: Iterable[str] = (), **kwargs: Any
                                ) -> "DelegationToken":
        return self._thread.run(self._admin.create_delegation_token(
            [renewers] if isinstance(renewers, str) else list(renewers), **kwargs))

    def renew_delegation_token(self, token: "DelegationToken", **kwargs: Any) -> int:
        return self._thread.run(self._admin.renew_delegation_token(token, **kwargs))

    def expire_delegation_token(self, token: "DelegationToken", **kwargs: Any) -> int:
        return self._thread.run(self._admin.expire_delegation_token(token, **kwargs))

    def describe_delegation_token(self, owners: Iterable[str] | None = None
                                  ) -> list["DelegationToken"]:
        return self._thread.run(self._admin.describe_delegation_token(
            None if owners is None else list(owners)))

    def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        return self._thread.run(self._admin.create_acls(list(bindings)))

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[AclBinding]:
        return self._thread.run(self._admin.delete_acls(list(filters)))

    def describe_acls(self, acl_filter: AclBindingFilter = AclBindingFilter()
                      ) -> list[AclBinding]:
        return self._thread.run(self._admin.describe_acls(acl_filter))

    def alter_client_quotas(self, entity: Mapping[str, str],
                            quotas: Mapping[str, float | None], **kwargs: Any) -> None:
        return self._thread.run(self._admin.alter_client_quotas(entity, quotas, **kwargs))

    def describe_client_quotas(self) -> list[tuple[dict[str, str], dict[str, float]]]:
        return self._thread.run(self._admin.describe_client_quotas())

    def describe_topics(self, names: Iterable[str] | None = None
                        ) -> dict[str, TopicDescription]:
        return self._thread.run(self._admin.describe_topics(
            None if names is None else list(names)))

    def list_topics(self) -> list[str]:
        return self._thread.run(self._admin.list_topics())

    def create_partitions(self, counts: Mapping[str, int], **kwargs: Any
                          ) -> dict[str, KraftlogError | None]:
        return self._thread.run(self._admin.create_partitions(dict(counts), **kwargs))

    def describe_configs(self, topic: str, keys: Iterable[str] | None = None
                         ) -> dict[str, ConfigEntry]:
        return self._thread.run(self._admin.describe_configs(
            topic, None if keys is None else list(keys)))

    def alter_configs(self, topic: str, changes: Mapping[str, Any], **kwargs: Any) -> None:
        return self._thread.run(self._admin.alter_configs(topic, dict(changes), **kwargs))

    def elect_leaders(self, partitions: Iterable[Any] | None = None,
                      election_type: str = "preferred"
                      ) -> dict[TopicPartition, KraftlogError | None]:
        return self._thread.run(self._admin.elect_leaders(
            None if partitions is None else list(partitions), election_type))

    def alter_partition_reassignments(self, reassignments: Mapping[Any, list[int] | None],
                                      **kwargs: Any) -> dict[TopicPartition, KraftlogError | None]:
        return self._thread.run(self._admin.alter_partition_reassignments(
            dict(reassignments), **kwargs))

    def list_partition_reassignments(self, topics: Iterable[str] | None = None
                                     ) -> dict[TopicPartition, PartitionReassignment]:
        return self._thread.run(self._admin.list_partition_reassignments(
            None if topics is None else list(topics)))

    def delete_consumer_groups(self, group_ids: Iterable[str]) -> None:
        self._thread.run(self._admin.delete_consumer_groups(list(group_ids)))

    def alter_consumer_group_offsets(self, group_id: str,
                                     offsets: Mapping[Any, int | OffsetAndMetadata]) -> None:
        self._thread.run(self._admin.alter_consumer_group_offsets(group_id, dict(offsets)))

    def list_consumer_group_offsets(self, group_id: str
                                    ) -> dict[TopicPartition, OffsetAndMetadata]:
        return self._thread.run(self._admin.list_consumer_group_offsets(group_id))

    def list_transactions(self) -> list[dict]:
        return self._thread.run(self._admin.list_transactions())

    def describe_transaction(self, transactional_id: str) -> dict | None:
        return self._thread.run(self._admin.describe_transaction(transactional_id))

    def abort_transaction(self, transactional_id: str) -> None:
        self._thread.run(self._admin.abort_transaction(transactional_id))

    def complete_transaction(self, prepared: PreparedTransaction, commit: bool = True,
                             timeout_ms: int | None = None) -> None:
        self._thread.run(self._admin.complete_transaction(prepared, commit, timeout_ms))

    def describe_cluster(self) -> dict:
        return self._thread.run(self._admin.describe_cluster())

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._thread.run(self._admin.close())
        finally:
            self._thread.stop()
