"""Certificates of the secured local Kafka (``mailtap dev up --secure``), made with ``cryptography``.

One private CA signs the broker's certificate (``localhost`` and ``127.0.0.1``, for hostname
verification), the token endpoint's, and one client certificate per principal whose common name
*is* the principal name (the broker maps ``CN=mailtap-smtp-sink,...`` to ``User:mailtap-smtp-sink``).
Everything is PEM, which librdkafka, Python's ``ssl`` and the broker (``ssl.keystore.type=PEM``)
all read, so no keytool and no JKS. Nothing is downloaded.

    ca = CertificateAuthority.create(folder / "ca")
    ca.issue(folder / "broker", "localhost", hosts=["localhost", "127.0.0.1"])
    ca.issue(folder / "mailtap-admin", "mailtap-admin", key_password="s3cret")

Tests also use :func:`CertificateAuthority.issue` with ``valid_days=-1`` (an expired client
certificate) and a second :class:`CertificateAuthority` (a CA the broker does not trust).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: Long enough for a development machine; short enough that nobody mistakes these for real ones.
DEFAULT_VALID_DAYS = 365
#: The organisation in every subject: names the certificates in a `openssl x509 -text` listing.
ORGANISATION = "mailtap dev"


@dataclass(frozen=True)
class KeyPair:
    """A certificate and its private key, as PEM files."""

    certificate: Path
    key: Path
    #: None when the key file is not encrypted.
    key_password: str | None = None


def _name(common_name: str) -> x509.Name:
    # Most significant first in the encoding, so the RFC 2253 form the broker's principal
    # mapping reads is "CN=<name>,O=mailtap dev".
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANISATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _new_key() -> ec.EllipticCurvePrivateKey:
    # P-256: what every TLS stack here (OpenSSL in librdkafka and Python, the JDK) accepts,
    # and generated in microseconds where RSA-2048 takes ~100 ms per certificate.
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: str | None) -> None:
    # PKCS#8: the only private-key form the broker's PEM keystore reads (encrypted or not).
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    path.chmod(0o600)


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


@dataclass(frozen=True)
class CertificateAuthority:
    """A private CA: ``<folder>/ca.pem`` (what clients and the broker trust) and its key."""

    folder: Path

    @property
    def certificate(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def key(self) -> Path:
        return self.folder / "ca.key"

    @classmethod
    def create(cls, folder: Path, name: str = "mailtap dev CA") -> CertificateAuthority:
        """A new CA in ``folder``, or the one already there (configs written earlier stay valid)."""
        ca = cls(folder)
        if ca.certificate.exists() and ca.key.exists():
            return ca
        folder.mkdir(parents=True, exist_ok=True)
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=DEFAULT_VALID_DAYS * 5))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        _write_key(ca.key, key, None)
        ca.certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return ca

    def issue(
        self,
        folder: Path,
        common_name: str,
        *,
        hosts: Sequence[str] = (),
        key_password: str | None = None,
        valid_days: int = DEFAULT_VALID_DAYS,
    ) -> KeyPair:
        """A certificate for ``common_name`` signed by this CA, in ``folder/{cert,key}.pem``.

        With ``hosts`` it is a server certificate (those names and addresses as SANs), else a
        client certificate. A negative ``valid_days`` gives one that expired that many days ago.
        """
        folder.mkdir(parents=True, exist_ok=True)
        ca_key = serialization.load_pem_private_key(self.key.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise TypeError(f"{self.key}: expected the EC key this module writes")
        ca_cert = x509.load_pem_x509_certificate(self.certificate.read_bytes())
        key = _new_key()
        now = datetime.datetime.now(datetime.UTC)
        if valid_days >= 0:
            not_before = now - datetime.timedelta(minutes=5)
            not_after = now + datetime.timedelta(days=valid_days)
        else:
            not_after = now + datetime.timedelta(days=valid_days)
            not_before = not_after - datetime.timedelta(days=30)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if hosts else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before)
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if hosts:
            builder = builder.add_extension(_san(hosts), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        pair = KeyPair(folder / "cert.pem", folder / "key.pem", key_password)
        _write_key(pair.key, key, key_password)
        # The chain (leaf, then CA) in one file: what the broker's PEM keystore and
        # ssl.SSLContext.load_cert_chain expect.
        pair.certificate.write_bytes(
            cert.public_bytes(serialization.Encoding.PEM)
            + ca_cert.public_bytes(serialization.Encoding.PEM)
        )
        return pair
