"""The keyspace: the only module that knows where anything lives in etcd.

Every key recoverd reads or writes is named by a method of :class:`Keyspace`, and every watched key
is turned back into a typed reference by :meth:`Keyspace.parse`. No other module builds key strings
(a test greps for the prefix literal). docs/keyspace.md documents each key, its writer and readers.

Layout under the versioned prefix (default ``/recoverd/v1``)::

    leader/coordinator                         Leader        coordinator (leased)
    jobs/<job>/spec                            JobSpec       first launcher (create-if-absent)
    jobs/<job>/runs/<uid>/status               JobStatus     coordinator
    jobs/<job>/runs/<uid>/recovery             Recovery      coordinator
    jobs/<job>/runs/<uid>/history              History       coordinator
    jobs/<job>/runs/<uid>/nodes/<node>         NodeRecord    agent (leased)
    jobs/<job>/runs/<uid>/ranks/<node>         NodeRanks     agent
    jobs/<job>/runs/<uid>/decisions/<epoch>    Decision      strategy selector (create-if-absent)
    jobs/<job>/runs/<uid>/commands/<node>      Command       coordinator
    jobs/<job>/runs/<uid>/acks/<node>          CommandAck    agent
    jobs/<job>/runs/<uid>/signals/<seq>        Signal        coordinator
    jobs/<job>/inbox/<uid>/clients/<client>    ClientRecord  recovery client (leased)
    jobs/<job>/inbox/<uid>/faults/<fault_id>   Fault         agent / client; deleted by coordinator
    jobs/<job>/inbox/<uid>/reports/<participant>/<kind>  Report  agent / client
    events/<job>/<uid>/<event_id>              Event         every service (capped per job)
    rendezvous/<job>/<uid>/<key>               (raw bytes)   the job's ranks (taskd_client.pytorch's store)

What a job's ranks may write (registration, faults, reports) lives in the run's *inbox*, apart
from the records only the coordinator and agents write: etcd grants permissions by key range, so
one static range per job (``jobs/<job>/inbox/``) is what lets a rank's role write those and
nothing else of its job (docs/adr/0040-gateway-callers-and-rank-identity.md).

Events live outside ``jobs/`` so that writing one never wakes the reconcilers watching ``jobs/``
nor conflicts with the coordinator's fenced transactions over a run's keys. So does the ranks'
rendezvous store (torch.distributed's key-value store, hosted in etcd so it survives any rank).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from recoverd.errors import BadRecord

__all__ = ["DEFAULT_PREFIX", "KeyKind", "KeyRef", "Keyspace", "RunRef", "check_id", "printable"]

DEFAULT_PREFIX = "/recoverd/v1"

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,252}$")
_SEQ_WIDTH = 12


def printable(text: str) -> str:
    """A key (or any text) safe to log or store in a proto string field.

    The store decodes keys with ``surrogateescape`` so that bytes that are not UTF-8 survive a
    round trip; such a key holds lone surrogates, which protobuf refuses. Shown here as escapes.
    """
    return text.encode("utf-8", errors="backslashreplace").decode("utf-8")


def check_id(kind: str, value: str) -> str:
    """Return ``value`` if it is a valid id (job, node, participant, fault); raise otherwise.

    Ids become key segments, so they must not contain ``/`` or start with punctuation.
    """
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise BadRecord(f"invalid {kind} id {value!r}: use 1-253 of [A-Za-z0-9._:-], starting alphanumeric")
    return value


@dataclass(frozen=True, slots=True)
class RunRef:
    """One run of a named job: every per-run key lives under its uid."""

    job: str
    uid: str


class KeyKind(StrEnum):
    """What a parsed key names."""

    LEADER = "leader"
    JOB_SPEC = "spec"
    STATUS = "status"
    RECOVERY = "recovery"
    HISTORY = "history"
    NODE = "nodes"
    CLIENT = "clients"
    RANKS = "ranks"
    FAULT = "faults"
    REPORT = "reports"
    DECISION = "decisions"
    COMMAND = "commands"
    ACK = "acks"
    SIGNAL = "signals"
    DRILL = "drills"
    EVENT = "events"


#: What a job's ranks write: under ``jobs/<job>/inbox/<uid>/``, every other run record under ``runs/``.
_INBOX_KINDS = {KeyKind.CLIENT, KeyKind.FAULT, KeyKind.REPORT}
_RUN_SINGLETONS = {KeyKind.STATUS, KeyKind.RECOVERY, KeyKind.HISTORY}
_RUN_COLLECTIONS = {
    KeyKind.NODE,
    KeyKind.CLIENT,
    KeyKind.RANKS,
    KeyKind.FAULT,
    KeyKind.DECISION,
    KeyKind.COMMAND,
    KeyKind.ACK,
    KeyKind.SIGNAL,
    KeyKind.DRILL,
}


@dataclass(frozen=True, slots=True)
class KeyRef:
    """A parsed key: its kind, the job (and run) it belongs to and the item name within it."""

    kind: KeyKind
    job: str = ""
    uid: str = ""
    name: str = ""
    sub: str = ""

    @property
    def run(self) -> RunRef:
        return RunRef(self.job, self.uid)


@dataclass(frozen=True, slots=True)
class Keyspace:
    """Names every key under one prefix (``--prefix`` / ``RECOVERD_PREFIX``)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or self.prefix.endswith("/") or "//" in self.prefix:
            raise BadRecord(f"invalid key prefix {self.prefix!r}: must start with '/' and not end with '/'")

    # ---------------------------------------------------------------- global
    def leader(self) -> str:
        return f"{self.prefix}/leader/coordinator"

    def jobs_prefix(self) -> str:
        return f"{self.prefix}/jobs/"

    # ---------------------------------------------------------------- job
    def job_prefix(self, job: str) -> str:
        return f"{self.prefix}/jobs/{check_id('job', job)}/"

    def job_spec(self, job: str) -> str:
        return f"{self.job_prefix(job)}spec"

    def runs_prefix(self, job: str) -> str:
        return f"{self.job_prefix(job)}runs/"

    def run_prefix(self, run: RunRef) -> str:
        return f"{self.runs_prefix(run.job)}{check_id('run', run.uid)}/"

    def status(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}status"

    def recovery(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}recovery"

    def history(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}history"

    def nodes_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}nodes/"

    def node(self, run: RunRef, node: str) -> str:
        return f"{self.nodes_prefix(run)}{check_id('node', node)}"

    def inbox_prefix(self, job: str) -> str:
        """Every run's inbox: what the job's ranks may write (the client role's one range)."""
        return f"{self.job_prefix(job)}inbox/"

    def run_inbox_prefix(self, run: RunRef) -> str:
        """One run's inbox (registrations, faults, reports); removed together with the run."""
        return f"{self.inbox_prefix(run.job)}{check_id('run', run.uid)}/"

    def clients_prefix(self, run: RunRef) -> str:
        return f"{self.run_inbox_prefix(run)}clients/"

    def client(self, run: RunRef, client_id: str) -> str:
        return f"{self.clients_prefix(run)}{check_id('client', client_id)}"

    def ranks_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}ranks/"

    def ranks(self, run: RunRef, node: str) -> str:
        return f"{self.ranks_prefix(run)}{check_id('node', node)}"

    def faults_prefix(self, run: RunRef) -> str:
        return f"{self.run_inbox_prefix(run)}faults/"

    def fault(self, run: RunRef, fault_id: str) -> str:
        return f"{self.faults_prefix(run)}{check_id('fault', fault_id)}"

    def reports_prefix(self, run: RunRef) -> str:
        return f"{self.run_inbox_prefix(run)}reports/"

    def report(self, run: RunRef, participant: str, kind: str) -> str:
        return f"{self.reports_prefix(run)}{check_id('participant', participant)}/{check_id('report kind', kind)}"

    def decisions_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}decisions/"

    def decision(self, run: RunRef, epoch: int) -> str:
        return f"{self.decisions_prefix(run)}{int(epoch):0{_SEQ_WIDTH}d}"

    def commands_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}commands/"

    def command(self, run: RunRef, node: str) -> str:
        return f"{self.commands_prefix(run)}{check_id('node', node)}"

    def acks_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}acks/"

    def ack(self, run: RunRef, node: str) -> str:
        return f"{self.acks_prefix(run)}{check_id('node', node)}"

    def signals_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}signals/"

    def signal(self, run: RunRef, seq: int) -> str:
        return f"{self.signals_prefix(run)}{int(seq):0{_SEQ_WIDTH}d}"

    def drills_prefix(self, run: RunRef) -> str:
        return f"{self.run_prefix(run)}drills/"

    def drill(self, run: RunRef, node: str) -> str:
        """The drill pending for ``node``'s agent (``recoverctl inject``)."""
        return f"{self.drills_prefix(run)}{check_id('node', node)}"

    # ---------------------------------------------------------------- events
    def events_prefix(self, run: RunRef) -> str:
        return f"{self.prefix}/events/{check_id('job', run.job)}/{check_id('run', run.uid)}/"

    def job_events_prefix(self, job: str) -> str:
        return f"{self.prefix}/events/{check_id('job', job)}/"

    def event(self, run: RunRef, event_id: str) -> str:
        return f"{self.events_prefix(run)}{check_id('event', event_id)}"

    # ---------------------------------------------------------------- the ranks' rendezvous store
    def rendezvous_prefix(self, run: RunRef) -> str:
        """Keys of torch.distributed's store for one run; below it the store's own key names."""
        return f"{self.prefix}/rendezvous/{check_id('job', run.job)}/{check_id('run', run.uid)}/"

    def job_rendezvous_prefix(self, job: str) -> str:
        return f"{self.prefix}/rendezvous/{check_id('job', job)}/"

    def rendezvous_generation(self, run: RunRef) -> str:
        """The generation counter of the run's ResilientGroup (``taskd_client.pytorch``): present
        once its ranks formed a group that a restarted rank rejoins (ADR 0041)."""
        return f"{self.rendezvous_prefix(run)}gen"

    # ---------------------------------------------------------------- parsing
    def job_of(self, key: str | bytes) -> str | None:
        """The job a key under ``jobs/`` belongs to, even when the rest of the key is malformed.

        Watchers use it to wake the job's reconciler, which then records and removes a bad key;
        None for keys outside ``jobs/`` or with an invalid job segment.
        """
        text = key.decode(errors="replace") if isinstance(key, bytes) else key
        root = self.jobs_prefix()
        if not text.startswith(root):
            return None
        job = text[len(root) :].split("/", 1)[0]
        return job if _ID_RE.match(job) else None

    def parse(self, key: str | bytes) -> KeyRef:
        """Turn a key under the prefix back into a :class:`KeyRef`; raise BadRecord if it is not ours.

        Used by watch handlers to find which job a changed key belongs to. Ids are re-checked, so
        a hand-written key such as ``jobs/a b/spec`` is rejected, not misrouted.
        """
        text = key.decode("utf-8", errors="surrogateescape") if isinstance(key, bytes) else key
        root = f"{self.prefix}/"
        if not text.startswith(root):
            raise BadRecord(f"key {text!r} is outside the prefix {self.prefix!r}")
        parts = text[len(root) :].split("/")
        if parts == ["leader", "coordinator"]:
            return KeyRef(KeyKind.LEADER)
        if len(parts) >= 2 and parts[0] == "events":
            job = check_id("job", parts[1])
            uid = check_id("run", parts[2]) if len(parts) > 2 and parts[2] else ""
            name = parts[3] if len(parts) > 3 else ""
            return KeyRef(KeyKind.EVENT, job, uid, name)
        if len(parts) < 3 or parts[0] != "jobs":
            raise BadRecord(f"key {text!r} names nothing recoverd knows")
        job = check_id("job", parts[1])
        if parts[2:] == ["spec"]:
            return KeyRef(KeyKind.JOB_SPEC, job)
        if len(parts) < 5 or parts[2] not in ("runs", "inbox"):
            raise BadRecord(f"key {text!r} names nothing recoverd knows")
        uid = check_id("run", parts[3])
        try:
            kind = KeyKind(parts[4])
        except ValueError:
            raise BadRecord(f"key {text!r}: unknown record kind {parts[4]!r}") from None
        if (kind in _INBOX_KINDS) != (parts[2] == "inbox"):
            raise BadRecord(
                f"key {text!r}: {kind.value} records live under {'inbox' if kind in _INBOX_KINDS else 'runs'}/"
            )
        rest = parts[5:]
        if kind in _RUN_SINGLETONS and not rest:
            return KeyRef(kind, job, uid)
        if kind in _RUN_COLLECTIONS and len(rest) == 1:
            return KeyRef(kind, job, uid, check_id(kind.value, rest[0]))
        if kind is KeyKind.REPORT and len(rest) == 2:
            return KeyRef(kind, job, uid, check_id("participant", rest[0]), check_id("report kind", rest[1]))
        raise BadRecord(f"key {text!r}: malformed {kind.value} key")
