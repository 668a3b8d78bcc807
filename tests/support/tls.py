"""What a test needs to reach Azurite over HTTPS with Entra ID tokens: a self-signed
certificate for 127.0.0.1 and bearer tokens Azurite's ``--oauth basic`` takes (it checks the
audience, the issuer's form and the expiry, not the signature)."""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import time
from pathlib import Path

TENANT = "ab1f708d-50f6-404c-a006-d71b2ac7a606"  # any tenant id: Azurite checks its form


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, written to ``directory`` (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "azurite-cert.pem", directory / "azurite-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def bearer_token(lifetime: float, now: float | None = None) -> str:
    """A JWT for Azure Storage that expires ``lifetime`` seconds from ``now``."""
    issued = int(time.time() if now is None else now)

    def part(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    claims = {"aud": "https://storage.azure.com", "iss": f"https://sts.windows.net/{TENANT}/",
              "tid": TENANT, "oid": "00000000-0000-0000-0000-0000000000b5",
              "iat": issued - 60, "nbf": issued - 60, "exp": int(issued + lifetime)}
    return f"{part({'alg': 'RS256', 'typ': 'JWT'})}.{part(claims)}.c2lnbmF0dXJl"
