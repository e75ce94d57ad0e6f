"""A folder of certificates for a quick secure single-host setup: ``recoverd up --tls-dir DIR``.

Made once and reused (nothing is overwritten): a CA (``ca.pem``, ``ca-key.pem``), a server
certificate for the embedded etcd on loopback (``server.pem``, ``server-key.pem``: 127.0.0.1,
::1, localhost) and a client certificate (``client.pem``, ``client-key.pem``, common name
``recoverd``) for the services, agents and recoverctl. Private keys are written 0600, the folder
0700. For more than one host, use your own PKI or cert-manager (docs/security.md).

Built with ``cryptography`` (the ``tls`` extra: ``pip install 'recoverd[tls]'``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recoverd.errors import ConfigError

__all__ = ["TlsDir", "ensure"]

VALID_DAYS = 825
CLIENT_NAME = "recoverd"


@dataclass(frozen=True, slots=True)
class TlsDir:
    """Paths of the folder's files."""

    path: Path

    def file(self, name: str) -> str:
        return str(self.path / name)

    @property
    def ca(self) -> str:
        return self.file("ca.pem")

    @property
    def server(self) -> tuple[str, str]:
        return self.file("server.pem"), self.file("server-key.pem")

    @property
    def client(self) -> tuple[str, str]:
        return self.file("client.pem"), self.file("client-key.pem")


def _crypto() -> Any:
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError:
        raise ConfigError("--tls-dir needs the cryptography package: pip install 'recoverd[tls]'") from None
    return x509, hashes, serialization, ec, ExtendedKeyUsageOID, NameOID


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def ensure(path: str) -> TlsDir:
    """The folder's certificates, made now if the folder has none (ConfigError if it has some)."""
    folder = TlsDir(Path(path))
    names = ("ca.pem", "ca-key.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")
    present = [n for n in names if (folder.path / n).exists()]
    if len(present) == len(names):
        return folder
    if present:
        raise ConfigError(
            f"--tls-dir {path} holds only some of {', '.join(names)} ({', '.join(present)}): remove them or"
            " complete the set; recoverd never overwrites a certificate"
        )
    x509, hashes, serialization, ec, usage, oid = _crypto()
    try:
        folder.path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError(f"cannot create --tls-dir {path}: {err.strerror}") from None
    now = datetime.datetime.now(datetime.UTC)

    def key_pem(key: Any) -> bytes:
        return key.private_bytes(  # type: ignore[no-any-return]
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    def build(subject: str, issuer: Any, signer: Any, public: Any, *, ca: bool, extensions: list[Any]) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(oid.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(oid.COMMON_NAME, "recoverd local CA")])
    ca_cert = build("recoverd local CA", ca_name, ca_key, ca_key.public_key(), ca=True, extensions=[])
    server_key = ec.generate_private_key(ec.SECP256R1())
    names_ext = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]
    )
    server_cert = build(
        "localhost", ca_name, ca_key, server_key.public_key(), ca=False,
        extensions=[names_ext, x509.ExtendedKeyUsage([usage.SERVER_AUTH, usage.CLIENT_AUTH])],
    )  # fmt: skip
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = build(
        CLIENT_NAME, ca_name, ca_key, client_key.public_key(), ca=False,
        extensions=[x509.ExtendedKeyUsage([usage.CLIENT_AUTH])],
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    _write(folder.path / "ca-key.pem", key_pem(ca_key), True)
    _write(folder.path / "ca.pem", ca_cert.public_bytes(pem), False)
    _write(folder.path / "server-key.pem", key_pem(server_key), True)
    _write(folder.path / "server.pem", server_cert.public_bytes(pem), False)
    _write(folder.path / "client-key.pem", key_pem(client_key), True)
    _write(folder.path / "client.pem", client_cert.public_bytes(pem), False)
    return folder
