"""How recoverd authenticates to etcd: TLS files, a user and its password (docs/security.md).

One value, :class:`EtcdSecurity`, carries what every connection needs. Every entry point fills it
the same way (:func:`add_arguments`, :func:`from_args`), with one precedence:

1. the flags ``--etcd-cacert``, ``--etcd-cert``, ``--etcd-key``, ``--etcd-user``,
   ``--etcd-password-file``;
2. ``RECOVERD_ETCD_CACERT`` / ``_CERT`` / ``_KEY`` / ``_USER`` / ``_PASSWORD_FILE`` /
   ``_PASSWORD``; an empty value means "none" and stops the fall-back below (the agent sets them
   so for ranks of an etcd without TLS);
3. etcdctl's own ``ETCDCTL_CACERT`` / ``_CERT`` / ``_KEY`` / ``_USER`` (``name`` or
   ``name:password``) / ``_PASSWORD``, so an operator's etcdctl setup works as it is.

A password is never a flag: command lines are visible to every user of the host (``ps``). It comes
from a file (``--etcd-password-file``, read when connecting, so ranks can be given the path and
not the secret) or from ``RECOVERD_ETCD_PASSWORD``. It is kept out of ``repr`` and every message.

Certificate common-name authentication needs no user: with etcd's ``--client-cert-auth`` and auth
enabled, the client certificate's CN is the user.

Files are checked when the value is built (:meth:`EtcdSecurity.check`), so a typo is a clear
error and exit 2 before anything connects, not a TLS failure later.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from recoverd.errors import ConfigError

__all__ = [
    "ENV",
    "SECRET_ENV",
    "EtcdSecurity",
    "add_arguments",
    "add_rank_arguments",
    "check_secret_file",
    "endpoint_scheme",
    "for_ranks",
    "from_args",
    "from_env",
    "ranks_from_args",
    "read_bounded",
]

log = logging.getLogger(__name__)

#: Our variables, by field, and etcdctl's where it has one.
ENV: dict[str, tuple[str, str | None]] = {
    "cacert": ("RECOVERD_ETCD_CACERT", "ETCDCTL_CACERT"),
    "cert": ("RECOVERD_ETCD_CERT", "ETCDCTL_CERT"),
    "key": ("RECOVERD_ETCD_KEY", "ETCDCTL_KEY"),
    "user": ("RECOVERD_ETCD_USER", "ETCDCTL_USER"),
    "password_file": ("RECOVERD_ETCD_PASSWORD_FILE", None),
}
PASSWORD_ENV = "RECOVERD_ETCD_PASSWORD"
ETCDCTL_PASSWORD_ENV = "ETCDCTL_PASSWORD"
#: Variables that may hold a password (etcdctl's user may be ``name:password``): never passed to a rank.
SECRET_ENV = frozenset({PASSWORD_ENV, ETCDCTL_PASSWORD_ENV, "ETCDCTL_USER"})

#: A PEM file larger than this is not a certificate or a key (a chain of a few certificates is ~10 KiB).
MAX_PEM_BYTES = 1 << 20
MAX_PASSWORD_BYTES = 4096


@dataclass(frozen=True, slots=True)
class EtcdSecurity:
    """TLS files and credentials for etcd; all empty: plaintext, no authentication."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password_file: str | None = None
    #: Only from the environment; never printed (repr=False).
    password: str | None = field(default=None, repr=False)

    @property
    def tls(self) -> bool:
        """TLS is asked for by any TLS file (and by an ``https://`` endpoint: see the Store)."""
        return bool(self.cacert or self.cert or self.key)

    @property
    def authenticates(self) -> bool:
        return bool(self.user)

    def describe(self) -> str:
        """For logs: what is used, never a secret."""
        parts = []
        if self.tls:
            parts.append(f"TLS (CA {self.cacert or 'system'}" + (f", client cert {self.cert})" if self.cert else ")"))
        if self.user:
            parts.append(f"user {self.user}")
        elif self.cert:
            parts.append("the client certificate's common name as user")
        return ", ".join(parts) or "plaintext, no authentication"

    def check(self) -> EtcdSecurity:
        """Raise ConfigError for anything that cannot work; return self."""
        if bool(self.cert) != bool(self.key):
            given, missing = ("--etcd-cert", "--etcd-key") if self.cert else ("--etcd-key", "--etcd-cert")
            raise ConfigError(f"{given} needs {missing} too: a client certificate and its private key go together")
        for flag, path in (("--etcd-cacert", self.cacert), ("--etcd-cert", self.cert), ("--etcd-key", self.key)):
            if path:
                _read_pem(flag, path)
        if self.password_file and self.password is not None:
            raise ConfigError(f"both --etcd-password-file and ${PASSWORD_ENV} are set: give the password one way")
        if (self.password_file or self.password is not None) and not self.user:
            raise ConfigError("an etcd password was given without a user: add --etcd-user (or RECOVERD_ETCD_USER)")
        if self.user:
            if ":" in self.user:
                raise ConfigError(f"invalid etcd user {self.user.split(':')[0]!r}...: a user name has no ':'")
            if not self.password_file and self.password is None:
                raise ConfigError(
                    f"etcd user {self.user!r} needs a password: --etcd-password-file FILE or ${PASSWORD_ENV}"
                    " (never on the command line)"
                )
            if self.password_file:
                self.read_password()
        return self

    def read_password(self) -> str:
        """The password: from the file (first line, newline stripped), else from the environment."""
        if self.password is not None:
            return self.password
        if not self.password_file:
            raise ConfigError("no etcd password configured")
        check_secret_file(self.password_file, "etcd password file")
        try:
            with open(self.password_file, "rb") as f:
                raw = f.read(MAX_PASSWORD_BYTES + 1)
        except OSError as err:
            raise ConfigError(f"cannot read the etcd password file {self.password_file}: {err.strerror}") from None
        if len(raw) > MAX_PASSWORD_BYTES:
            raise ConfigError(f"etcd password file {self.password_file} is over {MAX_PASSWORD_BYTES} bytes")
        try:
            text = raw.decode().splitlines()[0] if raw.strip() else ""
        except UnicodeDecodeError:
            raise ConfigError(f"etcd password file {self.password_file} is not UTF-8 text") from None
        if not text:
            raise ConfigError(f"etcd password file {self.password_file} is empty")
        return text

    def channel_credentials(self) -> object:
        """gRPC channel credentials for TLS (the CA is required: see :meth:`require_ca`)."""
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=_read_pem("--etcd-cacert", self.cacert) if self.cacert else None,
            private_key=_read_pem("--etcd-key", self.key) if self.key else None,
            certificate_chain=_read_pem("--etcd-cert", self.cert) if self.cert else None,
        )

    def require_ca(self, endpoint: str) -> None:
        if not self.cacert:
            raise ConfigError(
                f"etcd endpoint {endpoint} asks for TLS, but no CA was given to verify its certificate:"
                " --etcd-cacert FILE (or RECOVERD_ETCD_CACERT / ETCDCTL_CACERT). recoverd never connects"
                " in plaintext in its place"
            )

    def rank_env(self) -> dict[str, str]:
        """What a rank's client needs to connect as this agent does: paths, never a secret. Every
        variable is set (empty: none), so a rank does not fall back to an etcdctl setup of its own."""
        env = {
            "RECOVERD_ETCD_CACERT": _abs(self.cacert),
            "RECOVERD_ETCD_CERT": _abs(self.cert),
            "RECOVERD_ETCD_KEY": _abs(self.key),
            "RECOVERD_ETCD_USER": self.user or "",
            "RECOVERD_ETCD_PASSWORD_FILE": _abs(self.password_file),
        }
        return env


def for_ranks(
    agent: EtcdSecurity,
    *,
    user: str | None = None,
    password_file: str | None = None,
    cert: str | None = None,
    key: str | None = None,
) -> EtcdSecurity:
    """The identity an agent hands its ranks: the job's narrow client identity, never its own.

    The CA is the agent's (the same etcd). A client certificate given for the ranks replaces the
    agent's; otherwise the agent's TLS files are passed on (transport: etcd with
    ``--client-cert-auth`` asks every client for one). The agent's *user* is never passed on: a
    rank acts as the given ``user`` (job J's ``recoverd-client-J``), or as no user at all, which
    etcd with authentication on refuses every key (docs/security.md, "Ranks").
    """
    if bool(cert) != bool(key):
        raise ConfigError("--rank-etcd-cert and --rank-etcd-key go together: a certificate and its private key")
    return EtcdSecurity(
        cacert=agent.cacert,
        cert=cert or agent.cert,
        key=key or agent.key,
        user=user,
        password_file=password_file,
    ).check()


def rank_identity_problem(agent: EtcdSecurity, ranks: EtcdSecurity, job: str) -> str | None:
    """Why the identity an agent hands its ranks (:func:`for_ranks`) is not job ``job``'s client
    identity, for a warning at the agent's start; None when it is (docs/security.md, "Ranks")."""
    if ranks.user:
        if not ranks.password_file:
            return (
                f"the ranks' etcd user {ranks.user} has its password in the environment, which ranks do not"
                " inherit: a rank's client cannot authenticate. Give it as --rank-etcd-password-file FILE"
            )
        return None
    if agent.user:
        return (
            f"ranks get no etcd user (never the agent's own, {agent.user}): with authentication on, their"
            " clients (DLRecoverManager, ResilientTrainer, the msrun plugin) are refused. Give them job"
            f" {job}'s client user: --rank-etcd-user recoverd-client-{job} --rank-etcd-password-file FILE"
            " (docs/security.md)"
        )
    if ranks.cert and ranks.cert == agent.cert:
        return (
            f"ranks get the agent's own client certificate {agent.cert}: where etcd takes its common name as"
            f" the user, they act as the agent. Give them job {job}'s client certificate:"
            " --rank-etcd-cert/--rank-etcd-key (docs/security.md)"
        )
    return None


def check_secret_file(path: str, what: str) -> None:
    """Warn (once per file and process) when a file holding a secret can be read by other users:
    anyone on the host who reads it acts with its identity. A warning, not an error: the file may
    be on a volume whose modes the process cannot change (a Kubernetes Secret's are 0644 unless
    ``defaultMode`` says otherwise), and refusing would stop the service over an operator's setup."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # the read that follows reports it
    if mode & (stat.S_IRGRP | stat.S_IROTH) and path not in _WARNED:
        _WARNED.add(path)
        log.warning(
            "%s %s can be read by %s (mode %o): anyone on this host who reads it can act with its"
            " identity; chmod 600 %s",
            what,
            path,
            "every user" if mode & stat.S_IROTH else "its group",
            stat.S_IMODE(mode),
            path,
        )


_WARNED: set[str] = set()


def _abs(path: str | None) -> str:
    return os.path.abspath(path) if path else ""


def read_bounded(flag: str, path: str, limit: int, what: str = "") -> bytes:
    """A configuration file's bytes, at most ``limit`` of them; ConfigError naming the flag, the
    path and the problem (unreadable, too large: ``what`` says what a file that large is not)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise ConfigError(f"{flag} {path}: cannot read it: {err.strerror}") from None
    if len(data) > limit:
        raise ConfigError(f"{flag} {path}: over {limit} bytes" + (f", {what}" if what else ""))
    return data


def _read_pem(flag: str, path: str | None) -> bytes:
    assert path
    data = read_bounded(flag, path, MAX_PEM_BYTES, "not a PEM certificate or key")
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{flag} {path}: not a PEM file (no '-----BEGIN' line)")
    return data


def endpoint_scheme(text: str) -> str | None:
    """``"https"``, ``"http"`` or None (no scheme, or MindCluster's ``etcd://``: TLS when TLS files are
    given) for a comma-separated endpoint list; ConfigError when its endpoints disagree (one
    connection setting serves them all)."""
    schemes: set[str | None] = set()
    for item in text.split(","):
        raw = item.strip().lower()
        if not raw:
            continue
        if raw.startswith("https://"):
            schemes.add("https")
        elif raw.startswith("http://"):
            schemes.add("http")
        else:
            schemes.add(None)
    if "https" in schemes and len(schemes) > 1:
        raise ConfigError(f"etcd endpoints {text!r} mix https:// with plaintext ones: give them all as https://")
    if len(schemes) == 1:
        return next(iter(schemes))
    return "http" if "http" in schemes else None


def from_env(env: Mapping[str, str] | None = None) -> EtcdSecurity:
    """The settings of the environment alone (what a rank's client uses)."""
    env = os.environ if env is None else env
    values: dict[str, str | None] = {}
    for name, (ours, etcdctl) in ENV.items():
        if ours in env:
            values[name] = env[ours] or None  # set but empty: none, and no fall-back
        elif etcdctl and env.get(etcdctl):
            values[name] = env[etcdctl]
        else:
            values[name] = None
    password = env.get(PASSWORD_ENV)
    if password is None and ENV["user"][0] not in env:
        user = values["user"]
        if user and ":" in user:  # etcdctl's --user name:password form
            values["user"], password = user.split(":", 1)
        elif ETCDCTL_PASSWORD_ENV in env:
            password = env[ETCDCTL_PASSWORD_ENV]
    if password == "":
        password = None
    return EtcdSecurity(password=password, **values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags, defaults None (the environment fills what is not given: :func:`from_args`)."""
    group = parser.add_argument_group(
        "etcd TLS and authentication",
        "Defaults: $RECOVERD_ETCD_CACERT, _CERT, _KEY, _USER, _PASSWORD_FILE (empty: none), else etcdctl's"
        " $ETCDCTL_CACERT, _CERT, _KEY, _USER. The password: a file, or $RECOVERD_ETCD_PASSWORD; never a flag."
        " An https:// endpoint needs --etcd-cacert (docs/security.md).",
    )
    group.add_argument("--etcd-cacert", metavar="FILE", default=None, help="CA bundle that signed etcd's certificate")
    group.add_argument("--etcd-cert", metavar="FILE", default=None, help="client certificate (mutual TLS)")
    group.add_argument("--etcd-key", metavar="FILE", default=None, help="the client certificate's private key")
    group.add_argument("--etcd-user", metavar="NAME", default=None, help="etcd user (password from a file or env)")
    group.add_argument(
        "--etcd-password-file", metavar="FILE", default=None, help="file holding the etcd user's password"
    )


def add_rank_arguments(parser: argparse.ArgumentParser) -> None:
    """The agent's flags for its ranks' etcd identity (job J's client user, docs/security.md)."""
    group = parser.add_argument_group(
        "the ranks' etcd identity",
        "What the agent gives its ranks (DLRecoverManager, ResilientTrainer, the msrun plugin): job J's"
        " client user (`recoverctl auth user J client`), which may write only registrations, faults,"
        " reports, events and rendezvous keys. Never the agent's own user. Defaults:"
        " $RECOVERD_RANK_ETCD_USER, _PASSWORD_FILE, _CERT, _KEY.",
    )
    group.add_argument("--rank-etcd-user", metavar="NAME", default=None, help="the ranks' etcd user")
    group.add_argument(
        "--rank-etcd-password-file", metavar="FILE", default=None, help="file with the ranks' user's password"
    )
    group.add_argument(
        "--rank-etcd-cert", metavar="FILE", default=None, help="the ranks' client certificate (CN: their user)"
    )
    group.add_argument("--rank-etcd-key", metavar="FILE", default=None, help="that certificate's private key")


def ranks_from_args(args: argparse.Namespace, agent: EtcdSecurity) -> EtcdSecurity:
    """The ranks' identity from the agent's flags (:func:`for_ranks`)."""
    return for_ranks(
        agent,
        user=getattr(args, "rank_etcd_user", None),
        password_file=getattr(args, "rank_etcd_password_file", None),
        cert=getattr(args, "rank_etcd_cert", None),
        key=getattr(args, "rank_etcd_key", None),
    )


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> EtcdSecurity:
    """Flags over the environment, checked."""
    env = os.environ if env is None else env
    base = from_env(env)
    given = {
        name: getattr(args, f"etcd_{name}")
        for name in ("cacert", "cert", "key", "user", "password_file")
        if getattr(args, f"etcd_{name}", None)
    }
    if "password_file" in given:
        base = replace(base, password=None)  # the flag's file wins over a password in the environment
    elif "user" in given and given["user"] != base.user and PASSWORD_ENV not in env:
        base = replace(base, password=None)  # etcdctl's password belongs to etcdctl's user
    return replace(base, **given).check()
