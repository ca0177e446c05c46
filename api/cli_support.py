"""What every part of the command line shares: its error, its help
formatter, and a JSON GET for the inspection endpoints.

The command modules (``api.cli``, ``api.console``, ``api.groups_cli``, the
chaos harness's ``chaos.chaos_cli``, the Spark example) import these from
here, never from ``api.cli``, so ``api.cli`` can import them without a cycle.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection

from protocol import DEFAULT_BOOTSTRAP

__all__ = ["DEFAULT_BOOTSTRAP", "CliError", "ExamplesFormatter", "add_security_arguments",
           "admin_call", "admin_client", "client_security", "configure_security", "get_json"]

#: The command's TLS settings (its global options): what every client it
#: makes, and every JSON request, connects with. One command, one process.
_security: dict = {}
_ssl_context = None
_authorization: str | None = None


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """Kafka's client security settings, as global options (with
    environment defaults, so a shell can set them once)."""
    import os

    group = parser.add_argument_group(
        "TLS", "How to reach brokers whose listener is SSL (docs/security.md). Each "
        "defaults to its environment variable.")
    group.add_argument("--security-protocol", choices=("PLAINTEXT", "SSL", "SASL_SSL"),
                       type=str.upper,
                       default=os.environ.get("KRAFTLOG_SECURITY_PROTOCOL", "PLAINTEXT"),
                       help="SSL: https:// for host:port addresses, certificates verified "
                            "($KRAFTLOG_SECURITY_PROTOCOL; default %(default)s)")
    group.add_argument("--ssl-cafile", default=os.environ.get("KRAFTLOG_SSL_CAFILE"),
                       metavar="PEM", help="CA certificates to trust ($KRAFTLOG_SSL_CAFILE; "
                                           "default: the system's)")
    group.add_argument("--ssl-certfile", default=os.environ.get("KRAFTLOG_SSL_CERTFILE"),
                       metavar="PEM", help="this client's certificate, for brokers that "
                                           "require one ($KRAFTLOG_SSL_CERTFILE)")
    group.add_argument("--ssl-keyfile", default=os.environ.get("KRAFTLOG_SSL_KEYFILE"),
                       metavar="PEM", help="its private key ($KRAFTLOG_SSL_KEYFILE)")
    group.add_argument("--sasl-username", default=os.environ.get("KRAFTLOG_SASL_USERNAME"),
                       metavar="USER", help="SASL_SSL: the user to authenticate as "
                                            "($KRAFTLOG_SASL_USERNAME)")
    group.add_argument("--sasl-password-file",
                       default=os.environ.get("KRAFTLOG_SASL_PASSWORD_FILE"), metavar="FILE",
                       help="SASL_SSL: a file whose first line is the password "
                            "($KRAFTLOG_SASL_PASSWORD_FILE, or $KRAFTLOG_SASL_PASSWORD)")
    group.add_argument("--sasl-token-file",
                       default=os.environ.get("KRAFTLOG_SASL_TOKEN_FILE"), metavar="FILE",
                       help="SASL_SSL: authenticate with a delegation token, the first line "
                            "of FILE (`kraftlog tokens create` prints one; "
                            "$KRAFTLOG_SASL_TOKEN_FILE)")


def configure_security(args: argparse.Namespace) -> None:
    """Take the parsed global TLS options; raises CliError for unusable files."""
    global _ssl_context, _authorization
    import base64
    import os

    from protocol import tls

    if args.security_protocol not in ("PLAINTEXT", "SSL", "SASL_SSL"):  # from the environment
        raise CliError(f"security protocol {args.security_protocol!r}: use PLAINTEXT, SSL or "
                       "SASL_SSL (check $KRAFTLOG_SECURITY_PROTOCOL)")
    _security.clear()
    _security.update(security_protocol=args.security_protocol, ssl_cafile=args.ssl_cafile,
                     ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    if args.security_protocol != "SASL_SSL" and (args.sasl_token_file or args.sasl_username):
        raise CliError(f"--sasl-username and --sasl-token-file are for --security-protocol "
                       f"SASL_SSL, not {args.security_protocol} (or set "
                       "$KRAFTLOG_SECURITY_PROTOCOL=SASL_SSL)")
    if args.security_protocol == "SASL_SSL" and args.sasl_token_file:
        if args.sasl_username:
            raise CliError("give --sasl-username or --sasl-token-file, not both")
        token = read_secret(args.sasl_token_file, "--sasl-token-file").strip()
        if not token or any(c.isspace() for c in token):
            raise CliError(f"--sasl-token-file {args.sasl_token_file}: its first line must be "
                           "a delegation token (what `kraftlog tokens create` prints), not "
                           f"{'nothing' if not token else 'text with spaces'}")
        _security.update(sasl_mechanism="OAUTHBEARER", sasl_oauth_token_provider=token)
        _authorization = "Bearer " + token
    elif args.security_protocol == "SASL_SSL" and args.sasl_username:
        password = os.environ.get("KRAFTLOG_SASL_PASSWORD")
        if args.sasl_password_file:
            password = read_secret(args.sasl_password_file, "--sasl-password-file")
        if password is None:
            raise CliError("--sasl-username needs --sasl-password-file (or "
                           "$KRAFTLOG_SASL_PASSWORD)")
        _security.update(sasl_plain_username=args.sasl_username, sasl_plain_password=password)
        _authorization = "Basic " + base64.b64encode(
            f"{args.sasl_username}:{password}".encode()).decode()
    try:
        _ssl_context = tls.client_context(args.ssl_cafile, args.ssl_certfile,
                                          args.ssl_keyfile) \
            if args.security_protocol in tls.TLS_PROTOCOLS or args.ssl_cafile \
            or args.ssl_certfile else None
    except tls.TlsConfigError as exc:
        raise CliError(str(exc)) from None


def read_secret(path: str, option: str) -> str:
    """The first line of ``path`` (a password file), or a CliError naming ``option``."""
    try:
        with open(path) as f:
            return f.readline().rstrip("\n")
    except OSError as exc:
        raise CliError(f"cannot read {option}: {exc}") from None


def client_security() -> dict:
    """The TLS keyword arguments of a client this command makes."""
    return dict(_security)


def admin_client(args: argparse.Namespace):
    """An ``Admin`` for the command's ``--bootstrap``, with its security."""
    from api.client import Admin

    return Admin(args.bootstrap, request_timeout_ms=10_000, **client_security())


def admin_call(action):
    """``action()``; a client error becomes a CliError saying its code."""
    from api.client import KraftlogError

    try:
        return action()
    except KraftlogError as exc:
        raise CliError(f"{exc.code}: {exc.message}") from None


class CliError(Exception):
    """A failure to report in one line, exit status 1."""


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps each line of prose to the terminal; keeps indented lines (the
    examples) exactly as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return "\n".join(indent + line if line.startswith(" ") or not line else
                         textwrap.fill(line, width, initial_indent=indent,
                                       subsequent_indent=indent)
                         for line in text.splitlines())


def at_active_controller(urls: list[str], path: str, body: dict, timeout_s: float,
                         post: Callable[[str, dict, float], object] | None = None, *,
                         wait_on: Collection[str] = (),
                         skip: Callable[[str], bool] | None = None) -> dict:
    """POST ``body`` to ``path`` of the active controller among ``urls``,
    following NOT_CONTROLLER hints (a controller removing itself names its
    successor) until ``timeout_s``: the answer, or CliError with the last
    refusal. ``post(url, body, timeout_s)`` sends one request (``post_json``
    by default) and raises CliError when nobody answers; an answer whose code
    is in ``wait_on`` is asked again after a pause (a change in flight);
    ``skip(url)`` leaves a controller out (one known to be down)."""
    import time

    post = post or (lambda url, body, timeout: post_json(url, body, timeout_s=timeout))
    deadline = time.monotonic() + timeout_s
    last = "no controller answered"
    while True:
        hinted = None
        for url in urls:
            if skip is not None and skip(url):
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                answer = post(url.rstrip("/") + path, body, left)
            except CliError as exc:
                last = str(exc)
                continue
            error = answer.get("error") if isinstance(answer, dict) else {"code": "?"}
            if not error:
                return answer
            code = error.get("code")
            last = f"{code}: {error.get('message')}"
            if code in wait_on:
                break
            if code != "NOT_CONTROLLER":
                raise CliError(last)  # a refusal, or an outcome only status can tell
            hinted = error.get("leader_url")
            if hinted:
                break
        if time.monotonic() >= deadline:
            raise CliError(f"gave up after {timeout_s:g} s: {last}")
        if hinted:
            urls = [hinted] + [u for u in urls if u != hinted]
        time.sleep(0.05 if hinted else 0.2)


def post_json(url: str, body: object, timeout_s: float = 30.0) -> object:
    """POST ``body`` as JSON; the decoded answer (an error body too)."""
    import json

    return get_json(url, timeout_s, json.dumps(body).encode())


def get_json(url: str, timeout_s: float = 10.0, data: bytes | None = None) -> object:
    import json
    import urllib.error
    import urllib.request

    headers = {"Accept": "application/json", "Content-Type": "application/json"}
    if _authorization:
        if not url.startswith("https://"):
            raise CliError(f"{url} is not https: a password is never sent in clear")
        headers["Authorization"] = _authorization
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s,
                                    context=_ssl_context) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        try:
            return json.load(exc)
        except ValueError:
            raise CliError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise CliError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}; is the node "
                       "running? (set --bootstrap or $KRAFTLOG_BOOTSTRAP)") from None
