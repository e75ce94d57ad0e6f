"""``recoverctl``: the operator's view of recoverd during an incident (docs/incident.md).

    recoverctl [--etcd URL] jobs [--json]             every job: state, ranks running, nodes, its recovery
    recoverctl [--etcd URL] status JOB [--json] [--watch]
                                                      ranks (node, pid, state, restarts) and the recovery
                                                      phase; --watch: again on every change (etcd watch)
                                                      until the job ends or Ctrl-C
    recoverctl [--etcd URL] events JOB [--json] [--follow]
                                                      the event log, one line each, oldest first;
                                                      --follow: then each new event as it is written
    recoverctl [--etcd URL] decisions JOB [--json]    every strategy decision with its reasons
    recoverctl [--etcd URL] timeline JOB [--json] [--recovery N] [--plot FILE.png]
                                                      the last recovery phase by phase, with durations
                                                      (only the last one's phases are kept); --plot draws it
    recoverctl [--etcd URL] stacks JOB [--recovery N] [--rank R] [--json]
                                                      the Python stacks captured before a hung rank was
                                                      stopped (the last recovery with stacks, or N)

    recoverctl [--etcd URL] policy show JOB [--json]  the job's policy, in the policy file's form
    recoverctl [--etcd URL] policy set JOB FILE       validate FILE, then make it the job's policy
    recoverctl [--etcd URL] inject JOB --rank R --kind kill|exit|hang    a recorded drill (drills.py)
    recoverctl [--etcd URL] drain JOB NODE            move a node's ranks to an idle spare (drills.py)
    recoverctl completion bash|zsh                    a shell completion script (no etcd needed)

The read commands only read. ``policy set`` rewrites the job's spec record with the new policy,
in one transaction that compares the spec key's mod revision (and value) with what it read, so a
concurrent change makes it fail rather than be overwritten; an invalid file writes nothing.
``inject`` and ``drain`` write a drill or drain faults, ``auth`` etcd's roles and users.

``--json`` prints machine-readable output with the schemas of docs/recoverctl-schemas/ (records as
stored: proto3 JSON field names). Exit status: 0 ok (for ``status --watch``: the job ended), 1 not
found (an unknown job, a job whose spec record is bad, a recovery whose phases are not kept: the
reason is printed), 2 bad usage, a bad policy file, bad input, etcd unreachable or matplotlib
missing for ``--plot``, 3 an internal error, 130 Ctrl-C. Every failure is one line on stderr, never
a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence

import yaml

from recoverd import etcd_security
from recoverd.aiotools import ctrl_c_interrupts
from recoverd.cli import auth, completion, drills, plot, readcmds
from recoverd.cli.reads import NotFound, UnknownJob, read_view
from recoverd.errors import ConfigError, RecoverdError
from recoverd.keys import DEFAULT_PREFIX, Keyspace, printable
from recoverd.policy import JobPolicy, load_policy, policy_dict
from recoverd.records import decode, encode, pb
from recoverd.store import Compare, ModRevisionAtMost, Put, Store, ValueIs

__all__ = ["main"]


async def set_policy(store: Store, keys: Keyspace, job: str, policy: JobPolicy) -> pb.JobSpec:
    """Replace the policy in ``job``'s spec; the write fails if the spec changed since it was read.

    What the file does not set keeps the job's current strategies and flag-level budgets
    (``JobPolicy.to_pb``); deadlines, budgets, spares and allow_rank0_in_place are replaced.
    """
    key = keys.job_spec(job)
    kv = await store.get(key)
    if kv is None:
        raise UnknownJob(f"no job named {job!r} under {keys.prefix}")
    spec = decode(pb.JobSpec, kv.value, key)
    spec.policy.CopyFrom(policy.to_pb(spec.policy))
    compare: list[Compare] = [ValueIs(key, kv.value), ModRevisionAtMost(key, kv.mod_revision)]
    result = await store.txn(compare, [Put(key, encode(spec))])
    if not result.succeeded:
        raise ConfigError(f"job {job}'s spec changed while the policy was being set; nothing written, run it again")
    return spec


async def _policy(store: Store, keys: Keyspace, args: argparse.Namespace) -> int:
    if args.policy_cmd == "set":
        spec = await set_policy(store, keys, args.job, args.policy_file)
        print(f"policy of job {args.job} (run {spec.uid}) set from {args.file}:")
    else:
        view = await read_view(store, keys, args.job)
        assert view.spec is not None
        spec = view.spec
        if args.json:
            print(json.dumps(policy_dict(spec.policy), indent=2))
            return 0
    print(yaml.safe_dump(policy_dict(spec.policy), sort_keys=False).rstrip())
    return 0


async def _run(args: argparse.Namespace) -> int:
    keys = Keyspace(args.prefix)
    security = etcd_security.from_args(args)
    async with Store(args.etcd, connect_timeout_s=args.timeout, op_timeout_s=args.timeout, security=security) as store:
        await store.verify()
        if args.cmd == "auth":
            return await auth.run(store, keys, args)
        if args.cmd in ("inject", "drain"):
            result = await drills.run(store, keys, args)
            print(json.dumps(result, indent=2) if args.json else drills.describe(result))
            return 0 if result.get("taken", True) else 1
        if args.cmd == "policy":
            return await _policy(store, keys, args)
        return await readcmds.run(store, keys, args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recoverctl", description="Inspect recoverd jobs in etcd.")
    parser.add_argument(
        "--etcd", default=os.environ.get("RECOVERD_ETCD"), help="etcd endpoints (default: $RECOVERD_ETCD)"
    )
    parser.add_argument("--prefix", default=os.environ.get("RECOVERD_PREFIX", DEFAULT_PREFIX), help="%(default)s")
    parser.add_argument("--timeout", type=float, default=5.0, help="etcd timeout in seconds (%(default)s)")
    etcd_security.add_arguments(parser)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    jobs = sub.add_parser("jobs", help="every job under the prefix: state, ranks running, nodes, recovery")
    jobs.add_argument("--json", action="store_true", help="machine-readable output")
    commands: dict[str, argparse.ArgumentParser] = {}
    for name, text in (
        ("status", "ranks and the current recovery of a job"),
        ("events", "the event log of a job, oldest first"),
        ("decisions", "the strategy decisions of a job, with reasons"),
        ("timeline", "the last recovery of a job phase by phase, with durations"),
    ):
        cmd = commands[name] = sub.add_parser(name, help=text)
        cmd.add_argument("job")
        cmd.add_argument(
            "--json", action="store_true", help="machine-readable output (one object per line with --watch/--follow)"
        )
    commands["status"].add_argument(
        "--watch",
        action="store_true",
        help="show it again on every change (an etcd watch, no polling) until the job ends (exit 0) or Ctrl-C (130)",
    )
    commands["events"].add_argument(
        "--follow", action="store_true", help="then show each new event as it is written, until Ctrl-C (exit 130)"
    )
    commands["timeline"].add_argument(
        "--recovery",
        type=int,
        metavar="N",
        help="recovery N (only the job's last recovery has its phases kept: an earlier N is an error)",
    )
    commands["timeline"].add_argument(
        "--plot", metavar="FILE.png", help="also draw the phases as bars into a PNG file (needs matplotlib)"
    )
    stacks = sub.add_parser(
        "stacks",
        help="the Python stacks taken before a hung rank was stopped (docs/detectors.md)",
        description="The Python stacks (py-spy or faulthandler) of a hung rank and its node's peers, taken"
        " before the rank was stopped, with where each one was. Default: the last recovery that has stacks.",
    )
    stacks.add_argument("job")
    stacks.add_argument("--recovery", type=int, metavar="N", help="the stacks of recovery N (recoverctl timeline)")
    stacks.add_argument("--rank", type=int, metavar="R", help="only rank R's stack")
    stacks.add_argument("--json", action="store_true", help="machine-readable output")
    policy = sub.add_parser("policy", help="show or set a job's policy (docs/policy.md)")
    policy_sub = policy.add_subparsers(dest="policy_cmd", required=True, metavar="ACTION")
    show = policy_sub.add_parser("show", help="the job's policy, in the policy file's form")
    show.add_argument("job")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    set_ = policy_sub.add_parser("set", help="validate FILE, then make it the job's policy (the only write)")
    set_.add_argument("job")
    set_.add_argument("file")
    auth.add_parser(sub)
    drills.add_parsers(sub)
    shell = sub.add_parser("completion", help="print a shell completion script: source <(recoverctl completion bash)")
    shell.add_argument("shell", choices=completion.SHELLS)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd == "completion":
        print(completion.script(parser, "recoverctl", args.shell), end="")
        sys.exit(0)
    # One line per failure: library warnings (a known-bad etcd release, which the services log)
    # would bury the answer; errors still show, as "recoverctl: ..." lines.
    logging.basicConfig(level=logging.ERROR, format="recoverctl: %(message)s")
    # Except a secret that others can read: that is this command's setup to fix (docs/security.md).
    logging.getLogger("recoverd.etcd_security").setLevel(logging.WARNING)
    if not args.etcd:
        print("recoverctl: error: no etcd endpoint (--etcd or RECOVERD_ETCD)", file=sys.stderr)
        sys.exit(2)
    try:
        if args.cmd == "policy" and args.policy_cmd == "set":
            args.policy_file = load_policy(args.file)  # a bad file is refused before etcd is touched
        if getattr(args, "plot", None):
            plot.require_matplotlib()  # refused before etcd is touched too
        code = asyncio.run(ctrl_c_interrupts(_run(args)))
    except NotFound as err:
        print(f"recoverctl: {err.detail}", file=sys.stderr)
        code = 1
    except RecoverdError as err:
        print(f"recoverctl: error: {printable(str(err))}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    except BrokenPipeError:  # `recoverctl events J --follow | head`: the reader is gone, so are we
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    except Exception as err:  # an operator tool during an incident: one line, never a traceback
        print(f"recoverctl: internal error: {printable(repr(err))[:500]}", file=sys.stderr)
        code = 3
    sys.exit(code)


if __name__ == "__main__":
    main()
