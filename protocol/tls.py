"""TLS for kraftlog's HTTP listeners and for every client of them.

Kafka's model, with PEM files instead of Java keystores: a listener's
security protocol is ``PLAINTEXT`` or ``SSL`` (``listener.security.protocol.map``);
an ``SSL`` listener presents ``ssl.certfile``/``ssl.keyfile`` and, with
``ssl.client.auth`` ``requested`` or ``required``, asks clients for a
certificate signed by ``ssl.cafile``. A client trusts ``ssl_cafile`` (the
system's CAs without one), checks the server's host name unless told not
to, and presents ``ssl_certfile``/``ssl_keyfile`` where the server asks.

A URL says which a server speaks: ``https://`` for ``SSL``, ``http://`` for
``PLAINTEXT``. Nodes register their broker URL with its scheme, so clients
and peers that learn a broker from metadata connect the right way.

``CertificateReloader`` re-reads the files of a server's context when they
change on disk: new connections get the new certificate, open ones keep
theirs (a certificate rotated without a restart).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import ssl

logger = logging.getLogger(__name__)

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL)
#: Kafka's names for the protocols that add SASL authentication.
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
CLIENT_AUTH = ("none", "requested", "required")


class TlsConfigError(ValueError):
    """A certificate, key or CA file that cannot be used, said plainly."""


def scheme(security_protocol: str) -> str:
    return "https" if security_protocol == SSL else "http"


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
        # certificate must verify either way, and client_certificate_required
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


def client_certificate_required(app) -> None:
    """Refuse, on ``app``, every request whose connection presented no
    client certificate (``ssl.client.auth = required``).

    The TLS layer asks for one without insisting (a certificate that is
    presented must still verify, or the handshake fails): a client that has
    none gets a 401 ``SSL_AUTHENTICATION_FAILED`` that says what to set,
    where a refusal inside the TLS 1.3 handshake reaches it as a bare
    disconnect it would retry."""
    from aiohttp import web

    from protocol.errors import SslAuthenticationError

    @web.middleware
    async def require_certificate(request, handler):
        transport = request.transport
        if transport is None or not transport.get_extra_info("peercert"):
            raise SslAuthenticationError(
                "this listener requires a client certificate (ssl.client.auth = required): "
                "connect with ssl_certfile and ssl_keyfile (--ssl-certfile, --ssl-keyfile), "
                "a certificate signed by a CA the node trusts")
        return await handler(request)

    from protocol import wire
    app.middlewares.insert(app.middlewares.index(wire.error_middleware) + 1,
                           require_certificate)  # its refusal is an error body


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


def session(context: ssl.SSLContext | None, **kwargs):
    """An aiohttp client session that calls ``https://`` URLs with
    ``context`` (the default context without one)."""
    import aiohttp
    connector = aiohttp.TCPConnector(ssl=context) if context is not None else None
    return aiohttp.ClientSession(connector=connector, **kwargs)
