"""``kraftlog certs create``: a local CA and certificates for a dev cluster.

What a team needs to try TLS without a PKI: a CA (``ca.pem``, its key
``ca-key.pem``), one certificate per node (``node-<id>.pem`` and
``node-<id>-key.pem``, naming every host given, for ``ssl.certfile`` and
``ssl.keyfile``), and one for a client (``client.pem``, ``client-key.pem``:
mutual TLS, ``ssl.client.auth = required``). Keys are EC P-256, unencrypted,
readable by their owner only. For production, use your organisation's CA:
the node only needs PEM files.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import ipaddress
import os

#: The hosts a dev certificate names when none are given.
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclasses.dataclass(frozen=True)
class Issued:
    certfile: str
    keyfile: str


def _key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _write_atomically(path: str, data: bytes, mode: int) -> None:
    """Write ``path`` whole or not at all (a node reloading it never reads
    half a file)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def _write_key(path: str, key) -> None:
    from cryptography.hazmat.primitives import serialization
    _write_atomically(path, key.private_bytes(serialization.Encoding.PEM,
                                              serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()), 0o600)


def _write_cert(path: str, cert) -> None:
    from cryptography.hazmat.primitives import serialization
    _write_atomically(path, cert.public_bytes(serialization.Encoding.PEM), 0o644)


def subject_of(common_name: str) -> str:
    """The subject of a certificate ``issue`` makes for ``common_name``, as
    a node names it (RFC 2253, most specific first): what the principal
    ``User:<subject>`` (ssl.principal.mapping.rules DEFAULT) holds."""
    return f"CN={common_name},O={ORGANIZATION}"


ORGANIZATION = "kraftlog dev"


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts) -> list:
    from cryptography import x509
    names = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


class CertificateAuthority:
    """A CA that signs node and client certificates (in memory, and in
    ``ca.pem``/``ca-key.pem`` once ``save``d)."""

    def __init__(self, key, cert) -> None:
        self.key, self.cert = key, cert

    @classmethod
    def create(cls, days: int = 3650, name: str | None = None) -> "CertificateAuthority":
        """A new CA; its name is unique (``kraftlog dev CA <random>``), so a
        node that trusts an old and a new one picks the right issuer."""
        import secrets

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        name = name or f"kraftlog dev CA {secrets.token_hex(4)}"
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder()
                .subject_name(_name(name)).issuer_name(_name(name))
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False),
                    critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                               critical=False)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @classmethod
    def load(cls, issued: Issued) -> "CertificateAuthority":
        """A CA saved before (``ca.pem`` and ``ca-key.pem``), to sign more."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        with open(issued.certfile, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(issued.keyfile, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), None)
        return cls(key, cert)

    def save(self, directory: str) -> Issued:
        issued = Issued(os.path.join(directory, "ca.pem"), os.path.join(directory, "ca-key.pem"))
        _write_key(issued.keyfile, self.key)
        _write_cert(issued.certfile, self.cert)
        return issued

    def issue(self, directory: str, stem: str, common_name: str, hosts=(),
              days: int = 365, not_before: datetime.datetime | None = None) -> Issued:
        """A certificate for ``common_name`` (and ``hosts``, for servers)
        written to ``<stem>.pem`` and ``<stem>-key.pem``; good for both
        server and client use. ``not_before``: for a test's expired one."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.x509.oid import ExtendedKeyUsageOID
        key = _key()
        start = not_before or datetime.datetime.now(datetime.timezone.utc) - \
            datetime.timedelta(minutes=5)
        builder = (x509.CertificateBuilder()
                   .subject_name(_name(common_name)).issuer_name(self.cert.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start)
                   .not_valid_after(start + datetime.timedelta(days=days))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                  critical=True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                         ExtendedKeyUsageOID.CLIENT_AUTH]),
                                  critical=False)
                   .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                                  critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                       self.key.public_key()), critical=False))
        if hosts:
            builder = builder.add_extension(x509.SubjectAlternativeName(_san(hosts)),
                                            critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(os.path.join(directory, f"{stem}.pem"),
                        os.path.join(directory, f"{stem}-key.pem"))
        _write_key(issued.keyfile, key)  # key first: a reload never pairs a new cert with
        _write_cert(issued.certfile, cert)  # the old key
        return issued


def create(directory: str, nodes: int = 3, hosts=DEFAULT_HOSTS, days: int = 365,
           force: bool = False) -> dict[str, Issued]:
    """A CA, ``nodes`` node certificates and a client one in ``directory``.
    Refuses to replace files there unless ``force`` (nodes may be using them)."""
    os.makedirs(directory, exist_ok=True)
    stems = ["ca", *(f"node-{n}" for n in range(1, nodes + 1)), "client"]
    existing = [name for stem in stems for name in (f"{stem}.pem", f"{stem}-key.pem")
                if os.path.exists(os.path.join(directory, name))]
    if existing and not force:
        raise FileExistsError(
            f"{directory} already holds {', '.join(existing[:4])}"
            f"{' ...' if len(existing) > 4 else ''}: running nodes may use them. Choose "
            "another directory, or --force to replace them all (with a new CA: every node "
            "and client then needs the new files)")
    ca = CertificateAuthority.create()
    made = {"ca": ca.save(directory)}
    for node_id in range(1, nodes + 1):
        made[f"node-{node_id}"] = ca.issue(directory, f"node-{node_id}", f"node-{node_id}",
                                           hosts, days)
    made["client"] = ca.issue(directory, "client", "client", (), days)
    return made


def add_commands(commands: argparse._SubParsersAction) -> None:
    certs = commands.add_parser(
        "certs", help="make a local CA and TLS certificates for a dev cluster",
        description="Certificates for trying TLS (docs/security.md). For production, use "
                    "your organisation's CA: a node needs only PEM files.")
    kinds = certs.add_subparsers(dest="certs_command", metavar="ACTION")
    kinds.required = True
    create_parser = kinds.add_parser(
        "create", help="a CA, node-<id> certificates and a client certificate",
        description="Writes ca.pem (trust it: ssl.cafile, --ssl-cafile), node-<id>.pem "
                    "and node-<id>-key.pem (ssl.certfile, ssl.keyfile of node <id>), and "
                    "client.pem / client-key.pem (--ssl-certfile, --ssl-keyfile, for "
                    "ssl.client.auth = required). Keys are written readable by you only.")
    create_parser.add_argument("--dir", required=True, help="where to write them")
    create_parser.add_argument("--nodes", type=int, default=3,
                               help="node certificates to make (default %(default)s)")
    create_parser.add_argument("--hosts", default=",".join(DEFAULT_HOSTS),
                               help="host names and IPs the node certificates name, "
                                    "comma-separated (default %(default)s)")
    create_parser.add_argument("--days", type=int, default=365,
                               help="validity of the node and client certificates "
                                    "(default %(default)s)")
    create_parser.add_argument("--force", action="store_true",
                               help="replace certificates already in --dir (a new CA)")
    create_parser.set_defaults(handler=_create)


def _create(args: argparse.Namespace) -> int:
    from api.cli_support import CliError
    from api.table import format_table

    if args.nodes < 0 or args.days < 1:
        raise CliError("--nodes must be >= 0 and --days >= 1")
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    try:
        made = create(args.dir, args.nodes, hosts, args.days, force=args.force)
    except FileExistsError as exc:
        raise CliError(str(exc)) from None
    print(format_table(("for", "certificate", "key"),
                       [(name, issued.certfile, issued.keyfile) for name, issued in made.items()]))
    print(f"node certificates name: {', '.join(hosts)}; valid {args.days} days")
    return 0
