"""TLS and client authentication for kraftlog's HTTP listeners and clients.

Kafka's model, with PEM files instead of Java keystores: a listener's
security protocol is ``PLAINTEXT``, ``SSL`` or ``SASL_SSL``
(``listener.security.protocol.map``). A TLS listener presents
``ssl.certfile``/``ssl.keyfile`` and may ask clients for a certificate signed
by ``ssl.cafile``; ``authenticate_clients`` names each request's user from
it (``ssl.principal.mapping.rules``) or, on ``SASL_SSL``, from a SCRAM
user's name and password (``PasswordVerifier``). A client trusts
``ssl_cafile`` (the system's CAs without one), checks the server's host name
unless told not to, and presents ``ssl_certfile``/``ssl_keyfile``.

A URL says which a server speaks: ``https://`` for TLS, ``http://`` for
``PLAINTEXT``. Nodes register their broker URL with its scheme, so clients
and peers that learn a broker from metadata connect the right way.

``CertificateReloader`` loads a node's changed certificate files into its
live contexts: new connections get the new certificate, open ones keep
theirs (a certificate rotated without a restart).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import hashlib
import hmac
import logging
import os
import re
import ssl

from protocol import scram, tokens
from storage.clock import expiry_clock_ms
from protocol.errors import (BrokerNotAvailableError, ClusterAuthorizationFailedError,
                             SaslAuthenticationError, SslAuthenticationError)

logger = logging.getLogger(__name__)

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
#: TLS, and every request authenticated: a client certificate, or a SCRAM
#: user's name and password (HTTP Basic, inside TLS).
SASL_SSL = "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_SSL)
#: Refused: a password must never cross the network in clear.
SASL_PLAINTEXT = "SASL_PLAINTEXT"
TLS_PROTOCOLS = (SSL, SASL_SSL)
CLIENT_AUTH = ("none", "requested", "required")


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used, said plainly."""


def scheme(security_protocol: str) -> str:
    return "https" if security_protocol in TLS_PROTOCOLS else "http"


def url(address: str, security_protocol: str) -> str:
    """``host:port`` as a URL of ``security_protocol``; a URL stays as it is."""
    return address if "://" in address else f"{scheme(security_protocol)}://{address}"


def _load_chain(context: ssl.SSLContext, certfile: str, keyfile: str | None) -> None:
    for path in (certfile, keyfile):
        if path and not os.path.isfile(path):
            raise TlsConfigError(f"certificate or key file not found: {path}")
    try:
        context.load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(
            f"cannot use the certificate {certfile} with the key {keyfile or certfile}: "
            f"{exc} (both PEM, the key unencrypted and matching the certificate?)") from None


def _load_cas(context: ssl.SSLContext, cafile: str) -> None:
    try:
        context.load_verify_locations(cafile)
    except FileNotFoundError:
        raise TlsConfigError(f"CA file not found: {cafile}") from None
    except (ssl.SSLError, OSError) as exc:
        raise TlsConfigError(f"cannot read CA certificates from {cafile}: {exc}") from None


def server_context(certfile: str, keyfile: str | None, cafile: str | None = None,
                   client_auth: str = "none") -> ssl.SSLContext:
    """The context of an ``SSL`` listener (TLS 1.2 at least)."""
    if client_auth not in CLIENT_AUTH:
        raise TlsConfigError(f"ssl.client.auth must be one of {', '.join(CLIENT_AUTH)}, "
                             f"not {client_auth!r}")
    check_not_expired(certfile, "ssl.certfile")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, certfile, keyfile)
    if client_auth != "none":
        if not cafile:
            raise TlsConfigError(f"ssl.client.auth = {client_auth} needs ssl.cafile: the CA "
                                 "that signs the clients' certificates")
        _load_cas(context, cafile)
        # Optional at the TLS layer even when required: a presented
        # certificate must verify either way, and authenticate_clients
        # refuses the requests of a client without one in words it can read.
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def client_context(cafile: str | None = None, certfile: str | None = None,
                   keyfile: str | None = None, check_hostname: bool = True
                   ) -> ssl.SSLContext:
    """What a client (or a node calling its peers) verifies servers with:
    ``cafile``'s CAs and only those (as a Kafka truststore replaces the
    defaults), or the system's without one."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cafile:
        _load_cas(context, cafile)
    else:
        context.load_default_certs()
    context.check_hostname = check_hostname
    if certfile:
        check_not_expired(certfile, "the client certificate")
        _load_chain(context, certfile, keyfile)
    elif keyfile:
        raise TlsConfigError("a key file without a certificate file: give ssl_certfile too")
    return context


@dataclasses.dataclass
class CertificateReloader:
    """Re-loads a node's certificate, key and CA files into its live
    contexts (``server``: its SSL listeners'; ``peer``: the one it calls
    its peers with, presenting the same certificate) when one changes.

    The files are tried on scratch contexts first: a pair that does not
    load (a certificate replaced before its key, a half-written file, an
    expired certificate) is logged and tried again at the next check, and
    the live contexts keep what they had. A CA file adds to the CAs trusted
    (OpenSSL cannot drop one from a live context): a CA removed is trusted
    until a restart."""

    server: ssl.SSLContext
    peer: ssl.SSLContext | None
    certfile: str
    keyfile: str | None
    cafile: str | None

    def __post_init__(self) -> None:
        self._seen = self._stamps()

    def _stamps(self) -> tuple:
        stamps = []
        for path in (self.certfile, self.keyfile, self.cafile):
            try:
                info = os.stat(path) if path else None
            except OSError:
                info = None
            stamps.append(None if info is None else (
                info.st_ino, info.st_mtime_ns, info.st_ctime_ns, info.st_size))
        return tuple(stamps)

    def check(self) -> bool:
        """Reload if a file changed; whether it did."""
        stamps = self._stamps()
        if stamps == self._seen:
            return False
        try:
            check_not_expired(self.certfile, "the new ssl.certfile")
            _load_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.certfile, self.keyfile)
            if self.cafile:
                _load_cas(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), self.cafile)
        except TlsConfigError as exc:
            logger.warning("certificate files changed but cannot be loaded yet (the node "
                           "keeps serving the ones it had): %s", exc)
            return False
        # Both load: into the live contexts, with no await in between.
        for context in (self.server, self.peer):
            if context is None:
                continue
            _load_chain(context, self.certfile, self.keyfile)
            if self.cafile and context.verify_mode != ssl.CERT_NONE:
                _load_cas(context, self.cafile)
        self._seen = stamps
        logger.info("reloaded the TLS certificate %s", self.certfile)
        return True


#: The user of a request without a client certificate.
ANONYMOUS = "User:ANONYMOUS"
#: Routes served to anyone, authenticated or not: the web console's static
#: assets (api/broker/console.py), which carry no data. Decided by the route
#: the router matched, never by the path's text.
PUBLIC_ROUTES = frozenset({"/ui", "/ui/", "/ui/static/{name}"})
#: Where ``authenticate_clients`` leaves a request's user, and how it was
#: proven ("certificate", "password", "token"; absent: not at all).
PRINCIPAL_KEY = "kraftlog.principal"
PROOF_KEY = "kraftlog.proof"
#: On a request authenticated by a password or a token: an async callable
#: that checks the same credentials again and returns the user they prove
#: now (None: no longer valid). A stream opened by the request checks each
#: request it carries with it, as each POST is checked.
RECHECK_KEY = "kraftlog.recheck"
#: Proofs no node uses (a password, a delegation token): without ACLs, what
#: only nodes and administrators may do is refused to them.
NOT_A_NODE = frozenset({"password", "token"})


def authenticate_clients(app, mapper: "PrincipalMapper", require_certificate: bool,
                         verifier: "PasswordVerifier | None" = None) -> None:
    """On ``app`` (an SSL listener's), name every request's user from its
    client certificate: ``User:`` and what ``mapper``
    (``ssl.principal.mapping.rules``) makes of the certificate's subject, or
    ``User:ANONYMOUS`` without one. Refused, 401 ``SSL_AUTHENTICATION_FAILED``
    saying what to do: a request without a certificate where
    ``require_certificate`` (``ssl.client.auth = required``), and one whose
    subject no mapping rule matches (as Kafka refuses it).

    With ``verifier`` (a SASL_SSL listener), a request without a client
    certificate must carry a SCRAM user's name and password (HTTP Basic,
    inside TLS): its user is then ``User:<name>``; none or a wrong one is a
    401 ``SASL_AUTHENTICATION_FAILED``.

    The TLS layer asks for a certificate without insisting (one that is
    presented must still verify, or the handshake fails): a refusal inside
    the TLS 1.3 handshake would reach the client as a bare disconnect it
    retries; this one it can read."""
    from aiohttp import web

    @web.middleware
    async def authenticate(request, handler):
        route = request.match_info.route
        resource = route.resource if route is not None else None
        if resource is not None and resource.canonical in PUBLIC_ROUTES:
            # The web console's page, script and style: they hold no data,
            # and the page must load to ask for the user's credentials.
            request[PRINCIPAL_KEY] = ANONYMOUS
            return await handler(request)
        transport = request.transport
        cert = transport.get_extra_info("peercert") if transport is not None else None
        header = request.headers.get("Authorization")
        scheme, credentials = auth_scheme(header)
        if not cert and verifier is not None and scheme == "bearer":
            owner = verifier.authenticate_token(credentials)
            if owner is None:
                raise SaslAuthenticationError(
                    "the delegation token is unknown, wrong or expired: make a new one with "
                    "`kraftlog tokens create` (as its owner), or renew it before it expires")
            request[PRINCIPAL_KEY] = owner
            request[PROOF_KEY] = "token"

            async def recheck_token(credentials=credentials) -> str | None:
                return verifier.authenticate_token(credentials)
            request[RECHECK_KEY] = recheck_token
        elif not cert and verifier is not None:
            user = await verifier.authenticate(header)
            if user is None:
                raise SaslAuthenticationError(
                    "this listener is SASL_SSL: authenticate with a SCRAM user's name and "
                    "password (sasl_plain_username / sasl_plain_password; kraftlog users "
                    "create makes one) or a client certificate; the ones given are missing "
                    "or wrong")
            request[PRINCIPAL_KEY] = "User:" + user
            request[PROOF_KEY] = "password"

            async def recheck_password(header=header) -> str | None:
                again = await verifier.authenticate(header)
                return None if again is None else "User:" + again
            request[RECHECK_KEY] = recheck_password
        elif not cert:
            if require_certificate:
                raise SslAuthenticationError(
                    "this listener requires a client certificate (ssl.client.auth = "
                    "required): connect with ssl_certfile and ssl_keyfile (--ssl-certfile, "
                    "--ssl-keyfile), a certificate signed by a CA the node trusts")
            request[PRINCIPAL_KEY] = ANONYMOUS
        else:
            request[PRINCIPAL_KEY] = certificate_principal(cert, mapper)
            request[PROOF_KEY] = "certificate"
        return await handler(request)

    from protocol import wire
    app.middlewares.insert(app.middlewares.index(wire.error_middleware) + 1,
                           authenticate)  # its refusal is an error body


def certificate_principal(cert: dict, mapper: "PrincipalMapper") -> str:
    """The user a verified client certificate names: ``User:`` and what
    ``mapper`` (``ssl.principal.mapping.rules``) makes of its subject.
    Raises ``SslAuthenticationError`` when no rule matches (Kafka refuses
    such a client)."""
    subject = subject_name(cert.get("subject", ()))
    name = mapper.name(subject)
    if name is None:
        raise SslAuthenticationError(
            f"no ssl.principal.mapping.rules rule matches the client certificate's "
            f"subject {subject!r}: the node refuses it")
    return "User:" + name


def require_node_or_plain(request, what: str) -> None:
    """Refuse ``what`` (a call only nodes make: a follower's fetch, a
    transaction marker, a KIP-890 check) to a client that authenticated
    with a password: nodes authenticate with certificates. (A plain
    listener has no identities to tell them apart.)"""
    if request.get(PROOF_KEY) in NOT_A_NODE:
        raise ClusterAuthorizationFailedError(
            f"{what} is for the cluster's nodes, which authenticate with certificates, "
            f"not for {request.get(PRINCIPAL_KEY, ANONYMOUS)}")


def auth_scheme(header: str | None) -> tuple[str, str]:
    """(scheme in lower case, credentials) of an Authorization header
    (RFC 7235: the scheme is case-insensitive), ("", "") without one."""
    scheme, _, credentials = (header or "").strip().partition(" ")
    return scheme.lower(), credentials.strip()


def principal_of(request) -> str:
    """The user ``authenticate_clients`` named, else ``User:ANONYMOUS`` (a
    plain listener)."""
    return request.get(PRINCIPAL_KEY, ANONYMOUS)


_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU",
          "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
          "streetAddress": "STREET", "domainComponent": "DC", "userId": "UID",
          "emailAddress": "EMAILADDRESS"}


def subject_name(subject) -> str:
    """``ssl`` module's subject tuple as an RFC 2253 string (most specific
    RDN first, the way Java's X500Principal names it)."""
    parts = []
    for rdn in reversed(subject):
        parts.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(parts)


def _java_replacement(text: str, groups: int) -> str:
    """A Java ``Matcher.replaceAll`` replacement as a Python ``expand``
    template: ``$n`` takes as many digits as name an existing group (``$12``
    with one group is group 1 then "2"; a ``$n`` naming no group is left as
    text, as Kafka does), ``\\x`` is x itself."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            out.append(text[i + 1].replace("\\", "\\\\"))
            i += 2
        elif c == "$":
            j = i + 1
            if j >= len(text) or not text[j].isdigit() or int(text[j]) > groups:
                out.append("$")  # as Kafka takes it: literal text, not a group
                i += 1
                continue
            number = int(text[j])
            j += 1
            while j < len(text) and text[j].isdigit() and number * 10 + int(text[j]) <= groups:
                number = number * 10 + int(text[j])
                j += 1
            out.append(f"\\g<{number}>")
            i = j
        else:
            out.append("\\\\" if c == "\\" else c)
            i += 1
    return "".join(out)


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=#' else c for c in value)
    if out.startswith(" "):  # a "#" is escaped wherever it stands
        out = "\\" + out
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


def expiry(certfile: str):
    """When the first certificate in ``certfile`` expires (UTC), or None if
    it cannot be read."""
    try:
        from cryptography import x509
        with open(certfile, "rb") as f:
            return x509.load_pem_x509_certificate(f.read()).not_valid_after_utc
    except (OSError, ValueError):
        return None


def check_not_expired(certfile: str, what: str) -> None:
    """Raise ``TlsConfigError`` if ``certfile`` has expired."""
    import datetime
    ends = expiry(certfile)
    if ends is not None and ends <= datetime.datetime.now(datetime.timezone.utc):
        raise TlsConfigError(f"{what} {certfile} expired on {ends:%Y-%m-%d %H:%M} UTC: "
                             "renew it (`kraftlog certs create` makes new dev certificates)")


#: The client id a node's own calls to its peers carry (client quotas: no
#: ``<default>`` client-id quota meant for clients covers them by accident).
NODE_CLIENT_ID = "kraftlog-node"


def session(context: ssl.SSLContext | None, **kwargs):
    """An aiohttp client session for a node's calls to its peers: ``https://``
    URLs with ``context`` (the default context without one), each request
    naming its client id ``NODE_CLIENT_ID`` unless it names another."""
    import aiohttp

    from protocol.quotas import CLIENT_ID_HEADER
    connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
    headers = {CLIENT_ID_HEADER: NODE_CLIENT_ID, **kwargs.pop("headers", {})}
    return aiohttp.ClientSession(connector=connector, headers=headers, **kwargs)


class PrincipalMapper:
    """Kafka's ``ssl.principal.mapping.rules``: how a client certificate's
    subject (RFC 2253, ``CN=etl,OU=data,O=acme``) becomes a user name.

    Rules, tried in order, comma-separated: ``RULE:pattern/replacement/``
    (a regular expression the whole subject must match; ``$1``... in the
    replacement are its groups; an ``L`` or ``U`` after the last slash makes
    the name lower or upper case) and ``DEFAULT`` (the subject as it is). A
    subject no rule matches is refused, as in Kafka."""

    _RULE = re.compile(r"\s*(?:RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)|(DEFAULT))\s*(,|$)")

    def __init__(self, rules: str = "DEFAULT") -> None:
        self.rules: list[tuple[re.Pattern, str, str] | None] = []
        pos, text = 0, rules.strip()
        while pos < len(text):
            found = self._RULE.match(text, pos)
            if found is None:
                raise TlsConfigError(
                    f"ssl.principal.mapping.rules: cannot read {text[pos:]!r}: write "
                    "RULE:pattern/replacement/ (optionally /L or /U), or DEFAULT, "
                    "comma-separated")
            if found.group(4):
                self.rules.append(None)
            else:
                try:
                    pattern = re.compile(found.group(1).replace("\\/", "/"))
                except re.error as exc:
                    raise TlsConfigError(
                        f"ssl.principal.mapping.rules: bad pattern {found.group(1)!r}: "
                        f"{exc}") from None
                replacement = _java_replacement(found.group(2).replace("\\/", "/"),
                                                pattern.groups)
                self.rules.append((pattern, replacement, found.group(3)))
            pos = found.end()
        if not self.rules:
            self.rules.append(None)

    def name(self, subject: str) -> str | None:
        """The user name of ``subject``, or None: no rule matches it."""
        for rule in self.rules:
            if rule is None:
                return subject
            pattern, replacement, case = rule
            matched = pattern.fullmatch(subject)
            if matched:
                name = matched.expand(replacement)
                return name.lower() if case == "L" else name.upper() if case == "U" else name
        return None


class PasswordVerifier:
    """Checks HTTP Basic credentials against SCRAM credentials.

    ``credentials(user)`` gives the user's mechanism -> encoded credential
    (from the metadata image). Deriving a key is PBKDF2 (thousands of
    iterations): it runs off the event loop, two at a time (past
    ``WAITING_MAX`` waiting, a 503), and each success is remembered for that
    credential and a keyed digest of the password (never the password), so
    a client pays it once, and a credential changed or deleted is checked
    afresh. An unknown user costs a derivation too (a decoy credential),
    so timing does not tell who exists."""

    CACHE_MAX = 10_000
    #: Password checks that may queue; beyond, 503 (retriable) at once.
    WAITING_MAX = 64

    def __init__(self, credentials, ready=lambda: True, token_info=None,
                 token_secret: bytes | None = None) -> None:
        """``ready()``: whether the credentials are complete (a broker's
        metadata has caught up since start-up); until then every password
        is "try again" (503), not a verdict. ``token_info(token_id)``: a
        delegation token's ``TokenInfo`` or None, checked against
        ``token_secret`` (protocol/tokens.py); without both, no token works."""
        self.credentials = credentials
        self.ready = ready
        self.token_info = token_info
        self.token_secret = token_secret
        self._running = asyncio.Semaphore(2)
        self._waiting = 0
        self._pepper = os.urandom(32)
        self._known: set[tuple] = set()  # (user, credentials, password digest) that matched
        salt = scram.new_salt()
        self._decoy = scram.encode(scram.credential(scram.salted_password(
            os.urandom(16).hex(), salt, scram.ITERATIONS_DEFAULT, "SCRAM-SHA-512"), salt,
            scram.ITERATIONS_DEFAULT, "SCRAM-SHA-512"))

    def authenticate_token(self, text: str) -> str | None:
        """The owner (``User:<name>``) of the delegation token ``text``
        (``<id>.<hmac>``) if its HMAC is right and it has not expired."""
        parsed = tokens.parse_bearer(text)
        if parsed is None or self.token_info is None or not self.token_secret:
            return None
        if not self.ready():
            raise BrokerNotAvailableError("this node is still loading the cluster's "
                                          "metadata: retry")
        token_id, mac = parsed
        token = self.token_info(token_id)
        genuine = tokens.genuine(self.token_secret, token_id, mac)  # whether or not it exists
        if token is None or not genuine or token.expiration_timestamp_ms < expiry_clock_ms():
            return None
        return token.owner

    async def authenticate(self, header: str | None) -> str | None:
        """The user ``header`` (``Basic base64(user:password)``) proves, or None."""
        scheme, credentials = auth_scheme(header)
        if scheme != "basic":
            return None
        try:
            user, sep, password = base64.b64decode(credentials, validate=True).decode() \
                .partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep or not user:
            return None
        return await self.check_password(user, password)

    async def check_password(self, user: str, password: str) -> str | None:
        """``user`` if ``password`` is its password, else None (SASL PLAIN
        on the Kafka listener asks this too)."""
        if not self.ready():  # users half loaded: deleted ones, old passwords
            raise BrokerNotAvailableError("this node is still loading the cluster's users: "
                                          "retry")
        try:
            scram.check_user_name(user)
        except ValueError:
            return None
        creds = self.credentials(user) or {}
        if not creds:
            # Check a made-up credential all the same: answering an unknown
            # user faster than a wrong password would tell who exists.
            creds, user = {"SCRAM-SHA-512": self._decoy}, ""
        digest = hmac.new(self._pepper, password.encode(), hashlib.sha256).digest()
        key = (user, tuple(sorted(creds.items())), digest)
        known = key in self._known
        if not known:
            def check() -> bool:
                return any(scram.verify(password, scram.decode(value), mechanism)
                           for mechanism, value in creds.items() if mechanism in scram.MECHANISMS)
            if self._waiting >= self.WAITING_MAX:  # a flood of guesses: shed it
                raise BrokerNotAvailableError("too many password checks at once: retry")
            self._waiting += 1
            try:
                async with self._running:  # at most two derivations at a time
                    known = await asyncio.get_running_loop().run_in_executor(None, check)
            finally:
                self._waiting -= 1
            if known:  # successes only: a flood of wrong ones evicts nothing useful
                if len(self._known) >= self.CACHE_MAX:
                    self._known.clear()
                self._known.add(key)
        return user if known and user else None
