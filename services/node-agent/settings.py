"""What one node agent is asked to do: the settings every entry point builds, checked in one place.

``recoverd agent`` / ``run`` (flags), ``recoverd adopt`` (flags plus the adopted processes) and the
msrun plugin (msrun's environment) each map their own input onto :class:`AgentSettings`; what makes
settings valid is checked once, in ``__post_init__`` (as torchelastic's ``WorkerSpec`` does), so the
three cannot drift apart.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field

from recoverd.errors import ConfigError, JobSpecMismatch
from recoverd.etcd_security import EtcdSecurity
from recoverd.keys import check_id
from recoverd.records import pb
from recoverd.store import check_lease_ttl
from recoverd.strategies import TRAITS

__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "EXIT_FAILED",
    "EXIT_REFUSED",
    "EXIT_SIGINT",
    "EXIT_SIGTERM",
    "EXIT_SUCCEEDED",
    "NVML_HELP",
    "NVML_MODES",
    "AgentSettings",
]

#: The node lease's TTL unless told otherwise (every entry point's default; docs/adr/0025): the least
#: a stock etcd grants (1.5 x its 1 s election timeout, rounded up), so a dead node is declared in
#: about 1.8 s. An agent restarted by a supervisor is invisible to the coordinator only when it is
#: back within the lease: where restarts matter more than fast node loss, give a longer one.
DEFAULT_LEASE_TTL_S = 2

EXIT_SUCCEEDED = 0
EXIT_FAILED = 1
EXIT_REFUSED = 2
EXIT_SIGTERM = 143
EXIT_SIGINT = 130
#: ``--nvml``'s values and help (``recoverd run``/``agent``/``adopt``; the msrun plugin reads
#: ``RECOVERD_NVML``), docs/detectors.md.
NVML_MODES = ("auto", "on", "off")
NVML_HELP = (
    "GPU faults from NVML (XID errors, uncorrectable ECC, a GPU gone from the bus) for the rank on each GPU"
    " (its local rank, through CUDA_VISIBLE_DEVICES): auto = where nvidia-ml-py imports and NVML starts;"
    " on = also record an event where it cannot; off (default %(default)s; docs/detectors.md)"
)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything an agent needs; the CLI fills it from flags and environment."""

    job: str
    node: str
    argv: tuple[str, ...]
    etcd: str
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = 0
    strategies: tuple[str, ...] = ("exit",)
    #: Whether the strategies were asked for (``--strategies`` / ``--policy``): only then must they
    #: match a live job's (whose policy ``recoverctl policy set`` may have changed since).
    strategies_given: bool = True
    max_rank_restarts: int = 3
    max_job_restarts: int = 3
    restart_window_s: float = 600.0
    #: The job's whole policy (from --policy); None: built from the four fields above.
    policy: pb.Policy | None = None
    log_dir: str | None = None
    cwd: str | None = None
    master_addr: str | None = None
    master_port: int | None = None
    prefix: str = ""
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    stop_grace_s: float = 5.0
    #: The longest wait before restarting a rank that keeps failing right after its start
    #: (crash-loop backoff, docs/adr/0046); 0: restart at once, always.
    crash_backoff_max_s: float = 30.0
    retry_s: float = 0.1
    retry_max_s: float = 2.0
    extra_env: Mapping[str, str] = field(default_factory=dict)
    #: The etcd identity given to the ranks (job J's client user: docs/security.md); None: the
    #: agent's own connection settings (an embedded etcd without users).
    rank_etcd: EtcdSecurity | None = None
    #: A device plugin's reset.json to turn into faults (watched, never written).
    reset_json: str | None = None
    #: Where to mirror recoverd's state in reset.json form, for tools that read it.
    reset_json_mirror: str | None = None
    #: The NVML detector (XID errors, uncorrectable ECC, a GPU gone from the bus): "auto" runs it
    #: where nvidia-ml-py imports and NVML starts, "on" records an event where it cannot, "off".
    nvml: str = "auto"
    #: Signals that end the agent, and its exit code for each (ranks are stopped first).
    exit_signals: Mapping[int, int] = field(
        default_factory=lambda: {signal.SIGTERM: EXIT_SIGTERM, signal.SIGINT: EXIT_SIGINT}
    )
    #: Join a running job as a spare node: no ranks until a `recover` or an upgrade moves some here.
    spare: bool = False
    #: Warm spare processes kept ready (framework imported, waiting for a rank); 0 = none. Only for
    #: scripts that call ``taskd_client.pytorch.wait_for_rank()`` first (docs/pytorch.md).
    warm_spares: int = 0
    #: Seconds to wait after a warm spare is used before starting the next one (it would compete
    #: for CPU with the recovery it just sped up).
    warm_spare_refill_s: float = 1.0
    #: Fork restarted ranks from a pre-imported interpreter (recoverd.agent.warmstart): any plain
    #: ``python script.py`` / ``python -m module`` command, no code change (docs/pytorch.md).
    warm_start: bool = True
    #: What that interpreter imports: "auto" (the framework the job's interpreter has) or a
    #: comma-separated list of modules.
    warm_start_modules: str = "auto"
    #: The first start waits this long for the warm-start server to import, so that every rank is
    #: forked from it (docs/adr/0039); 0: the first start is plain and only restarts are forked.
    warm_start_wait_s: float = 30.0
    #: Judge the ranks' progress reports (hangs, stragglers: docs/detectors.md); the job's policy
    #: (``hang.enabled``) can still turn hang faults off. Off: no progress socket at all.
    hang_detection: bool = True

    def __post_init__(self) -> None:
        check_id("job", self.job)
        check_id("node", self.node)
        if not self.argv:
            raise ConfigError("no command to run for the ranks")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ConfigError(f"nproc-per-node {self.nproc_per_node} and nnodes {self.nnodes} must be at least 1")
        if not self.spare and not 0 <= self.node_rank < self.nnodes:
            raise JobSpecMismatch(f"--node-rank {self.node_rank} is outside 0..{self.nnodes - 1}")
        unknown = [s for s in self.strategies if s not in TRAITS]
        if unknown or not self.strategies:
            raise ConfigError(f"unknown strategies {unknown or list(self.strategies)}")
        check_lease_ttl(self.lease_ttl_s)
        if self.stop_grace_s < 0 or self.warm_spares < 0 or self.warm_start_wait_s < 0:
            raise ConfigError("stop grace, warm spares and the warm-start wait must not be negative")
        if self.nvml not in NVML_MODES:
            raise ConfigError(f"nvml {self.nvml!r}: choose one of {', '.join(NVML_MODES)}")

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @property
    def local_ranks(self) -> range:
        if self.spare:
            return range(0)
        start = self.node_rank * self.nproc_per_node
        return range(start, start + self.nproc_per_node)

    def group_rank(self, rank: int) -> int:
        """The node rank a global rank belongs to (ranks are laid out node by node)."""
        return rank // self.nproc_per_node
