"""The certificate authority of one sandbox's egress proxy, for the hosts it injects credentials into.

To add a header to an HTTPS request the proxy has to read it: for a host with an injection rule (and only for
those) it ends the program's TLS itself, with a certificate for that host signed by a CA made for this sandbox
alone, and opens its own TLS to the host, verified against this machine's trust store or the policy's
``upstream_ca`` (:func:`~.egressinject.upstream_context`). The CA's key is made here, kept in this process's memory
only and dropped with the proxy; it never enters the sandbox, which gets the CA's certificate (in a trust bundle:
the system's roots and this CA) and nothing else. The CA may only sign names under the injected hosts (a name
constraint), so even a leaked key vouches for nothing else. Needs the ``cryptography`` package
(``pip install 'execspace[inject]'``): import this module only for a policy with injection rules
(:func:`~.egressinject.make_ca` says what to install when it is missing).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import ssl
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

__all__ = ["TRUST_STORES", "EgressCA", "trust_bundle"]

#: Where systems keep the bundle of trusted roots that OpenSSL-based clients read by default (Debian and Alpine,
#: Fedora and RHEL, macOS/BSD/Alpine).
TRUST_STORES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem")
#: How long the CA and its certificates are valid: the CA lives as long as one sandbox's proxy, its key is never
#: stored; the bound is for a sandbox that outlives its expected life.
_VALIDITY = datetime.timedelta(days=30)
_SKEW = datetime.timedelta(minutes=5)
#: Leaf certificates kept per proxy (one per injected host asked for); more are minted anew.
_MAX_LEAVES = 256


class EgressCA:
    """One sandbox's CA: :attr:`cert_pem` goes into the sandbox; :meth:`server_context` gives the TLS context the
    proxy ends a program's TLS to ``host`` with (its certificate minted on first use and kept)."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        # one key for every leaf of this CA: minting a certificate is then a signature, not a key generation
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "execspace egress proxy (this sandbox)")])
        now = datetime.datetime.now(datetime.UTC)
        permitted = sorted({host.removeprefix("*.") for host in hosts})
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .add_extension(
                x509.NameConstraints(permitted_subtrees=[x509.DNSName(h) for h in permitted], excluded_subtrees=None),
                critical=True,
            )
        )
        self._cert = builder.sign(self._key, hashes.SHA256())
        self.cert_pem = self._cert.public_bytes(_pem())
        self._contexts: dict[str, ssl.SSLContext] = {}

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS server context for ``host`` (a lower-case name): its certificate, signed by this CA."""
        found = self._contexts.get(host)
        if found is None:
            if len(self._contexts) >= _MAX_LEAVES:
                self._contexts.clear()
            found = self._contexts[host] = self._context(host)
        return found

    def _context(self, host: str) -> ssl.SSLContext:
        now = datetime.datetime.now(datetime.UTC)
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, host)]))
            .issuer_name(self._cert.subject)
            .public_key(self._leaf_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        key = self._leaf_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])  # the proxy reads HTTP/1.1 only: a client offering h2 falls back
        with _memory_file(leaf.public_bytes(_pem()) + self._cert.public_bytes(_pem()) + key) as path:
            context.load_cert_chain(path)
        return context


def trust_bundle(ca_pem: bytes, system_root: str | None = None) -> bytes:
    """What a sandbox trusts: the roots of the first trust store found under ``system_root`` (the sandbox's system
    files; default ``/``) and ``ca_pem``, so clients told to read this file alone still reach every other host."""
    for path in TRUST_STORES:
        with contextlib.suppress(OSError):
            system = Path(f"{system_root or ''}{path}").read_bytes()
            return system.rstrip(b"\n") + b"\n" + ca_pem
    return ca_pem


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _pem() -> serialization.Encoding:
    return serialization.Encoding.PEM


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """A path holding ``data`` for as long as the block runs (``ssl`` loads keys from paths only): a memfd on Linux,
    so the leaf's key never touches a disk; a private temporary file elsewhere."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("execspace-egress-leaf", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="execspace-leaf-") as private:
        path = os.path.join(private, "leaf.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        yield path
