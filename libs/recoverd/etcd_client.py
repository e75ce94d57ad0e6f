"""aetcd's client, able to connect over TLS. Imported only by :mod:`recoverd.store`.

aetcd 1.0 (pinned; docs/adr/0002) opens only plaintext channels (``grpc.aio.insecure_channel``).
:class:`EtcdClient` opens a ``grpc.aio.secure_channel`` instead when given channel credentials,
and otherwise does what aetcd's ``connect`` does: authenticate when a user is set (the token goes
in every call's metadata), then create the stubs and the watcher. One difference: a user given to
an etcd whose authentication is off connects without a token (etcd answers ``Authenticate`` with
"authentication is not enabled"; every call is allowed then), so an administrator can connect as
root before turning authentication on. Everything else is aetcd's.

How etcd's answers read (the store sorts its errors with :func:`access_problem`):

* a certificate that does not verify, an expired one, or TLS against a plaintext server fails the
  TLS handshake: gRPC reports ``UNAVAILABLE`` with the handshake's reason in its details;
* a wrong user or password: ``INVALID_ARGUMENT`` "authentication failed, invalid user ID or
  password" from ``Authenticate``;
* a request outside the user's roles: ``PERMISSION_DENIED`` "permission denied";
* an expired token (etcd's simple tokens last ``--auth-token-ttl``, 300 s by default; every token
  is void after an etcd restart): ``UNAUTHENTICATED`` "invalid auth token": connect again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import aetcd
from aetcd import rpc, watcher

if TYPE_CHECKING:
    from recoverd.etcd_security import EtcdSecurity

__all__ = ["EtcdClient", "access_problem", "is_auth_disabled", "is_stale_token", "tls_hint"]

_TLS_HINTS = (
    "ssl",
    "tls",
    "handshake",
    "certificate",
    "wrong_version_number",
)
_AUTH_HINTS = ("authentication failed", "invalid user id or password", "user name is empty", "auth: ")


class EtcdClient(aetcd.Client):
    """An aetcd client over TLS when ``credentials`` (gRPC channel credentials) are given."""

    def __init__(self, *, credentials: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]  # another task is connecting: wait for it, as aetcd does
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            if self._credentials is None:
                self.channel = rpc.insecure_channel(target, options=self._options.items())
            else:
                self.channel = rpc.secure_channel(target, self._credentials, options=self._options.items())
            if self._username is not None and self._password is not None:
                self.auth_stub = rpc.AuthStub(self.channel)
                request = rpc.AuthenticateRequest(name=self._username, password=self._password)
                try:
                    response = await self.auth_stub.Authenticate(request, timeout=self._timeout)
                    self.metadata = (("token", response.token),)
                except rpc.AioRpcError as err:
                    if not is_auth_disabled(err.details() or ""):
                        aetcd.exceptions._handle_exception(err)
                    # Authentication is off: there is no token to get, and every call is allowed.
                    # `recoverctl auth setup --enable` connects as root before it turns it on.
                    self.metadata = None  # type: ignore[assignment]
            self.kvstub = rpc.KVStub(self.channel)
            self.clusterstub = rpc.ClusterStub(self.channel)
            self.leasestub = rpc.LeaseStub(self.channel)
            self.maintenancestub = rpc.MaintenanceStub(self.channel)
            self._watcher = watcher.Watcher(rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata)
            self._connected.set()
        finally:
            self._is_connecting = False


def is_auth_disabled(detail: str) -> bool:
    """etcd answers ``Authenticate`` so when its authentication is off: a user is then not needed."""
    return "authentication is not enabled" in detail.lower()


def access_problem(detail: str) -> str | None:
    """ "tls" or "auth" when an error's text says that the credentials, not the network, failed."""
    text = detail.lower()
    if any(hint in text for hint in _AUTH_HINTS):
        return "auth"
    if any(hint in text for hint in _TLS_HINTS):
        return "tls"
    return None


def is_stale_token(detail: str) -> bool:
    """etcd voided the token (expired, or etcd restarted): authenticating again fixes it."""
    return "invalid auth token" in detail.lower()


def tls_hint(detail: str, security: EtcdSecurity) -> str:
    """What a failed TLS handshake most likely means, in the user's terms (OpenSSL's reason codes)."""
    text = detail.upper()
    if "CERTIFICATE_VERIFY_FAILED" in text:
        return (
            f"the TLS handshake failed: etcd's certificate does not verify against --etcd-cacert {security.cacert}"
            " (another CA signed it, it has expired, or it does not name this host)"
        )
    if "CERTIFICATE_EXPIRED" in text:
        return "the TLS handshake failed: etcd refused this client's certificate as expired"
    if "BAD_CERTIFICATE" in text or "CERTIFICATE_REQUIRED" in text or "UNKNOWN_CA" in text:
        cert = f"--etcd-cert {security.cert}" if security.cert else "no client certificate (--etcd-cert)"
        return (
            f"the TLS handshake failed: etcd refused {cert}: it is expired, not signed by a CA etcd trusts"
            " (its --trusted-ca-file), or missing while etcd runs with --client-cert-auth"
        )
    if "WRONG_VERSION_NUMBER" in text or "PACKET_LENGTH_TOO_LONG" in text or "HTTP_REQUEST" in text:
        return "the TLS handshake failed: etcd does not serve TLS on this port (give it as http://HOST:PORT?)"
    return "the TLS handshake failed"
