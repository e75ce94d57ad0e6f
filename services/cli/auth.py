"""``recoverctl auth``: etcd roles and users for recoverd's least privilege (docs/security.md).

::

    recoverctl auth setup [--job J ...] [--enable] [--dry-run]
    recoverctl auth user JOB agent|client [--name NAME] (--password-file FILE | --no-password) [--dry-run]
    recoverctl auth user control|operator [--name NAME] (--password-file FILE | --no-password) [--dry-run]

Both are idempotent: they read etcd's roles and users, print the etcdctl command of each change
still missing, and make those changes (none with ``--dry-run``). A password is never printed or put
on a command line: ``--password-file`` names a file to read it from, or, when the file does not
exist, where a new random one is written (mode 0600). ``--no-password`` makes a user that only a
client certificate whose common name is the user's name can act as.
"""

from __future__ import annotations

import argparse
import os
import secrets

from recoverd import etcd_admin
from recoverd.errors import ConfigError
from recoverd.etcd_security import EtcdSecurity
from recoverd.keys import Keyspace
from recoverd.store import Store

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    auth = sub.add_parser(
        "auth",
        help="create etcd roles and users for least privilege (docs/security.md)",
        description="Roles: recoverd-control (the prefix, read-write), recoverd-operator (read-only),"
        " recoverd-agent-JOB and recoverd-client-JOB (only that job's keys). Prints the etcdctl"
        " equivalent of every change it makes; run with a user that may administer etcd (root).",
    )
    auth_sub = auth.add_subparsers(dest="auth_cmd", required=True, metavar="ACTION")
    setup = auth_sub.add_parser("setup", help="create the roles (and each --job's); idempotent")
    setup.add_argument("--job", action="append", default=[], help="also create this job's agent and client roles")
    setup.add_argument(
        "--enable", action="store_true", help="then turn etcd's authentication on (needs a root user already)"
    )
    setup.add_argument("--dry-run", action="store_true", help="print the etcdctl commands; change nothing")
    user = auth_sub.add_parser(
        "user",
        help="issue a user: JOB agent|client, or control|operator",
        description="Create a user with one role (creating the role if needed). JOB ROLE for a job's"
        " agent or client; ROLE alone for control or operator.",
    )
    user.add_argument("words", nargs="+", metavar="JOB ROLE", help="JOB agent|client, or control|operator")
    user.add_argument("--name", help="the user's name (default: the role's name; for --no-password the certificate CN)")
    how = user.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--password-file",
        metavar="FILE",
        help="read the password from FILE, or write a new random one there (0600) if it does not exist",
    )
    how.add_argument(
        "--no-password", action="store_true", help="certificate common-name authentication only (no password)"
    )
    user.add_argument("--dry-run", action="store_true", help="print the etcdctl commands; change nothing")


def _role_of(words: list[str]) -> tuple[str, str | None]:
    if len(words) == 2 and words[1] in etcd_admin.JOB_ROLES:
        return words[1], words[0]
    if len(words) == 1 and words[0] in etcd_admin.PLANE_ROLES:
        return words[0], None
    raise ConfigError(f"auth user {' '.join(words)}: expected JOB agent, JOB client, control or operator")


def _password(path: str, dry_run: bool) -> tuple[str, bool]:
    """(password, whether it was just made). A new one is written with O_EXCL and mode 0600."""
    if os.path.exists(path):
        return EtcdSecurity(user="-", password_file=path).read_password(), False
    password = secrets.token_urlsafe(24)
    if not dry_run:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as err:
            raise ConfigError(f"cannot create the password file {path}: {err.strerror}") from None
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
    return password, True


async def run(store: Store, keys: Keyspace, args: argparse.Namespace) -> int:
    state = await etcd_admin.read_state(store)
    if args.auth_cmd == "setup":
        steps = etcd_admin.plan_roles(state, keys, etcd_admin.job_roles(args.job))
        if args.enable:
            steps += etcd_admin.plan_enable(state)
        what = "roles" + (" and authentication" if args.enable else "")
    else:
        role, job = _role_of(args.words)
        role_name = etcd_admin.role_name(role, job)
        user = args.name or role_name
        password = None
        made = False
        if not args.no_password and user not in state.users:
            password, made = _password(args.password_file, args.dry_run)
        steps = etcd_admin.plan_roles(state, keys, [(role, job)])
        steps += etcd_admin.plan_user(state, user, role_name, password)
        what = f"user {user}"
        if made:
            print(f"# a new password for {user} {'would be' if args.dry_run else 'is'} in {args.password_file} (0600)")
    for step in steps:
        print(step.etcdctl)
    if not steps:
        print(f"# {what}: nothing to change")
        return 0
    if args.dry_run:
        print(f"# dry run: {len(steps)} change(s) not made")
        return 0
    await etcd_admin.apply(store, steps)
    print(f"# {what}: {len(steps)} change(s) made")
    return 0
