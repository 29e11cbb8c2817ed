"""The local cluster's certificates and the clients that present them.

One small CA made by openssl signs every component's certificate (`new_cert`); a kubeconfig
embeds one of them for a user (`write_kubeconfig`); `AdminClient` speaks HTTPS to the API
server as the admin.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from hack.processes import ClusterError, first_error


def openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {first_error(result.stderr)}")


def new_key(path: Path, algorithm: str = "EC") -> None:
    # P-256 for TLS: instant, where an RSA key takes a visible fraction of a second.
    options = "ec_paramgen_curve:P-256" if algorithm == "EC" else "rsa_keygen_bits:2048"
    openssl("genpkey", "-algorithm", algorithm, "-pkeyopt", options, "-out", str(path))
    path.chmod(0o600)


def new_cert(
    pki: Path, name: str, cn: str, *, ca: str = "", org: str = "", usage: str = "", sans: str = ""
) -> None:
    """PKI/NAME.key and PKI/NAME.crt: self-signed CA when `ca` is empty, else a leaf signed
    by PKI/CA.crt with extended key `usage` (serverAuth, clientAuth) and `sans`."""
    if ca:
        extensions = [
            "basicConstraints = critical, CA:FALSE",
            "keyUsage = critical, digitalSignature",
            f"extendedKeyUsage = {usage}",
            "authorityKeyIdentifier = keyid",
        ]
        if sans:
            extensions.append(f"subjectAltName = {sans}")
        signer = ["-CA", str(pki / f"{ca}.crt"), "-CAkey", str(pki / f"{ca}.key")]
    else:
        extensions = [
            "basicConstraints = critical, CA:TRUE",
            "keyUsage = critical, keyCertSign, cRLSign, digitalSignature",
            "subjectKeyIdentifier = hash",
        ]
        signer = []
    # A config of our own, so nothing from the system's openssl.cnf gets in.
    subject = [f"CN = {cn}", *([f"O = {org}"] if org else [])]
    config = pki / f"{name}.cnf"
    config.write_text(
        "\n".join(
            ["[req]", "distinguished_name = dn", "prompt = no", "[dn]", *subject, "[ext]"]
            + [*extensions, ""]
        )
    )
    new_key(pki / f"{name}.key")
    # `req -x509 -CA` (OpenSSL 3) makes and signs the certificate in one call.
    openssl(
        "req", "-x509", "-new", "-key", str(pki / f"{name}.key"), *signer,
        "-config", str(config), "-extensions", "ext", "-days", "3650",
        # A positive random serial: Go rejects negative ones, browsers repeated ones.
        "-set_serial", f"0x{secrets.randbits(120):x}",
        "-out", str(pki / f"{name}.crt"),
    )  # fmt: skip


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with everything embedded (JSON is valid YAML, so json does it)."""

    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tritonscale-local",
                "cluster": {"server": server, "certificate-authority-data": data("ca.crt")},
            }
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate-data": data(f"{user}.crt"),
                    "client-key-data": data(f"{user}.key"),
                },
            }
        ],
        "contexts": [
            {"name": "tritonscale-local", "context": {"cluster": "tritonscale-local", "user": user}}
        ],
        "current-context": "tritonscale-local",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(config, indent=2) + "\n")
    partial.chmod(0o600)
    os.replace(partial, path)


class AdminClient:
    """The API server at `server` as the cluster's admin: PKI/admin.crt, checked against
    PKI/ca.crt."""

    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        self.pki = pki
        self._context: ssl.SSLContext | None = None

    def ssl_context(self) -> ssl.SSLContext:
        if self._context is None:
            self._context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
            self._context.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return self._context

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
        """GET `path` from the apiserver as the admin: (status, body); (0, error) when the
        connection fails."""
        try:
            with urllib.request.urlopen(
                self.server + path, timeout=timeout_s, context=self.ssl_context()
            ) as response:
                return response.status, response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except (OSError, ssl.SSLError) as error:
            return 0, str(error)
