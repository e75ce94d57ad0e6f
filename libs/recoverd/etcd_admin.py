"""etcd roles and users for recoverd's least privilege (``recoverctl auth``; docs/security.md).

Who may write what — the roles, by key range under the prefix ``P``:

==================  ===========================================================================
role                permissions
==================  ===========================================================================
recoverd-control    readwrite ``P/`` (coordinator, strategy service, gateway of many jobs)
recoverd-operator   read ``P/`` (recoverctl's reads, dashboards)
recoverd-agent-J    readwrite ``P/jobs/J/``, ``P/events/J/``, ``P/rendezvous/J/`` (job J's agents)
recoverd-client-J   read ``P/jobs/J/``; readwrite ``P/jobs/J/inbox/``, ``P/events/J/``, ``P/rendezvous/J/``
                    (job J's ranks: DLRecoverManager, ResilientTrainer, the msrun plugin; a gateway
                    serving J)
==================  ===========================================================================

Every one of a job's keys is under a prefix that names the job (``recoverd.keys``), so a job's
role grants exactly that job. The client role writes only the job's *inbox* (client registrations,
faults, reports: ``recoverd.keys``), its events and its rendezvous store: never the job's spec or
policy, nor a run's status, recovery, commands or any other record the coordinator and agents keep.

:func:`plan` is pure: it compares what a role should grant with what etcd has, and returns the
steps still missing, each with its etcdctl equivalent, so ``setup`` is idempotent and
``--dry-run`` prints exactly what would run. :func:`apply` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aetcd.rpc as rpc

from recoverd.errors import ConfigError
from recoverd.keys import Keyspace, check_id
from recoverd.store import Store, _prefix_end

__all__ = [
    "JOB_ROLES",
    "PLANE_ROLES",
    "Grant",
    "Step",
    "apply",
    "job_roles",
    "plan_roles",
    "plan_user",
    "read_state",
    "role_grants",
    "role_name",
]

PLANE_ROLES = ("control", "operator")
JOB_ROLES = ("agent", "client")
READ, WRITE, READWRITE = "read", "write", "readwrite"
_PERM_TYPES = {READ: rpc.Permission.READ, WRITE: rpc.Permission.WRITE, READWRITE: rpc.Permission.READWRITE}
_PERM_NAMES = {v: k for k, v in _PERM_TYPES.items()}


@dataclass(frozen=True, slots=True, order=True)
class Grant:
    """One permission: ``kind`` on every key with ``prefix``."""

    prefix: str
    kind: str


@dataclass(frozen=True, slots=True)
class Step:
    """One change to etcd, with the etcdctl command that does the same (printed, never run)."""

    etcdctl: str
    method: str
    request: Any
    #: Text read from stdin by the etcdctl equivalent (a password: never in the printed command).
    secret: str | None = None


def role_name(role: str, job: str | None = None) -> str:
    if role in PLANE_ROLES:
        return f"recoverd-{role}"
    if role in JOB_ROLES:
        if not job:
            raise ConfigError(f"the {role} role is a job's: give the job")
        return f"recoverd-{role}-{check_id('job', job)}"
    raise ConfigError(f"unknown role {role!r}: one of {', '.join(PLANE_ROLES + JOB_ROLES)}")


def role_grants(keys: Keyspace, role: str, job: str | None = None) -> tuple[Grant, ...]:
    """What ``role`` (of ``job``) should grant: see the module docstring."""
    root = f"{keys.prefix}/"
    if role == "control":
        return (Grant(root, READWRITE),)
    if role == "operator":
        return (Grant(root, READ),)
    assert job is not None
    job_keys = keys.job_prefix(job)
    rendezvous = keys.job_rendezvous_prefix(job)
    if role == "agent":
        return (Grant(job_keys, READWRITE), Grant(keys.job_events_prefix(job), READWRITE), Grant(rendezvous, READWRITE))
    if role == "client":
        # Clients record events too (a registration, a fault report): the job's events, read-write.
        events = Grant(keys.job_events_prefix(job), READWRITE)
        inbox = Grant(keys.inbox_prefix(job), READWRITE)
        return (Grant(job_keys, READ), inbox, events, Grant(rendezvous, READWRITE))
    raise ConfigError(f"unknown role {role!r}")


def job_roles(jobs: list[str]) -> list[tuple[str, str | None]]:
    """(role, job) for the plane's roles and every job's."""
    return [(r, None) for r in PLANE_ROLES] + [(r, job) for job in jobs for r in JOB_ROLES]


@dataclass(slots=True)
class AuthState:
    """What etcd has: auth on or off, each role's grants, each user's roles."""

    enabled: bool
    roles: dict[str, set[Grant]]
    users: dict[str, set[str]]


async def read_state(store: Store) -> AuthState:
    enabled = bool((await store.auth_rpc("AuthStatus", rpc.AuthStatusRequest())).enabled)
    roles: dict[str, set[Grant]] = {}
    for name in (await store.auth_rpc("RoleList", rpc.AuthRoleListRequest())).roles:
        got = await store.auth_rpc("RoleGet", rpc.AuthRoleGetRequest(role=name))
        roles[name] = {_grant(p) for p in got.perm}
    users: dict[str, set[str]] = {}
    for name in (await store.auth_rpc("UserList", rpc.AuthUserListRequest())).users:
        users[name] = set((await store.auth_rpc("UserGet", rpc.AuthUserGetRequest(name=name))).roles)
    return AuthState(enabled, roles, users)


def _grant(perm: Any) -> Grant:
    key = bytes(perm.key).decode("utf-8", "surrogateescape")
    if bytes(perm.range_end) != _prefix_end(bytes(perm.key)):
        key += " (not a prefix)"  # someone else's permission: never equal to one of ours
    return Grant(key, _PERM_NAMES.get(perm.permType, str(perm.permType)))


def plan_roles(state: AuthState, keys: Keyspace, roles: list[tuple[str, str | None]]) -> list[Step]:
    """The steps that create the missing roles and grant their missing permissions."""
    steps: list[Step] = []
    for role, job in roles:
        name = role_name(role, job)
        have = state.roles.get(name)
        if have is None:
            steps.append(Step(f"etcdctl role add {name}", "RoleAdd", rpc.AuthRoleAddRequest(name=name)))
            have = set()
        for grant in role_grants(keys, role, job):
            if grant in have:
                continue
            key = grant.prefix.encode()
            perm = rpc.Permission(permType=_PERM_TYPES[grant.kind], key=key, range_end=_prefix_end(key))
            steps.append(
                Step(
                    f"etcdctl role grant-permission {name} {grant.kind} {grant.prefix} --prefix=true",
                    "RoleGrantPermission",
                    rpc.AuthRoleGrantPermissionRequest(name=name, perm=perm),
                )
            )
    return steps


def plan_user(state: AuthState, user: str, role: str, password: str | None) -> list[Step]:
    """Steps that create ``user`` (``password`` None: certificate common-name auth only) and give
    it ``role``. An existing user keeps its password."""
    steps: list[Step] = []
    if user not in state.users:
        if password is None:
            steps.append(
                Step(
                    f"etcdctl user add {user} --no-password",
                    "UserAdd",
                    rpc.AuthUserAddRequest(name=user, options=rpc.UserAddOptions(no_password=True)),
                )
            )
        else:
            steps.append(
                Step(
                    f"etcdctl user add {user} --interactive=false   # password on stdin",
                    "UserAdd",
                    rpc.AuthUserAddRequest(name=user, password=password),
                    secret=password,
                )
            )
    if role not in state.users.get(user, set()):
        steps.append(
            Step(
                f"etcdctl user grant-role {user} {role}",
                "UserGrantRole",
                rpc.AuthUserGrantRoleRequest(user=user, role=role),
            )
        )
    return steps


def plan_enable(state: AuthState) -> list[Step]:
    """Turn authentication on; etcd needs a ``root`` user with the ``root`` role first."""
    if state.enabled:
        return []
    if "root" not in state.users.get("root", set()):
        raise ConfigError(
            "etcd needs a root user with the root role before authentication can be enabled:"
            " etcdctl user add root && etcdctl user grant-role root root (keep its password safe), then run again"
        )
    return [Step("etcdctl auth enable", "AuthEnable", rpc.AuthEnableRequest())]


async def apply(store: Store, steps: list[Step]) -> None:
    for step in steps:
        await store.auth_rpc(step.method, step.request)
