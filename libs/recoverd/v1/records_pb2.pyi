import datetime
from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_RUNNING: _ClassVar[JobState]
    JOB_SUCCEEDED: _ClassVar[JobState]
    JOB_FAILED: _ClassVar[JobState]

class RankState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RANK_STATE_UNSPECIFIED: _ClassVar[RankState]
    RANK_PENDING: _ClassVar[RankState]
    RANK_RUNNING: _ClassVar[RankState]
    RANK_SUCCEEDED: _ClassVar[RankState]
    RANK_FAILED: _ClassVar[RankState]
    RANK_STOPPED: _ClassVar[RankState]

class FaultSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAULT_SOURCE_UNSPECIFIED: _ClassVar[FaultSource]
    SOURCE_AGENT: _ClassVar[FaultSource]
    SOURCE_CLIENT: _ClassVar[FaultSource]
    SOURCE_LEASE: _ClassVar[FaultSource]

class ReportKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_KIND_UNSPECIFIED: _ClassVar[ReportKind]
    REPORT_STOP_COMPLETE: _ClassVar[ReportKind]
    REPORT_STRATEGIES: _ClassVar[ReportKind]
    REPORT_RECOVER_STATUS: _ClassVar[ReportKind]

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_COLLECTING: _ClassVar[Phase]
    PHASE_STOPPING: _ClassVar[Phase]
    PHASE_GLOBAL_FAULT: _ClassVar[Phase]
    PHASE_DECIDING: _ClassVar[Phase]
    PHASE_RECOVERING: _ClassVar[Phase]
    PHASE_DONE: _ClassVar[Phase]
    PHASE_FAILED: _ClassVar[Phase]

class CommandAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMMAND_ACTION_UNSPECIFIED: _ClassVar[CommandAction]
    ACTION_RESTART_RANKS: _ClassVar[CommandAction]
    ACTION_RESTART_ALL: _ClassVar[CommandAction]
    ACTION_STOP_ALL: _ClassVar[CommandAction]
JOB_STATE_UNSPECIFIED: JobState
JOB_RUNNING: JobState
JOB_SUCCEEDED: JobState
JOB_FAILED: JobState
RANK_STATE_UNSPECIFIED: RankState
RANK_PENDING: RankState
RANK_RUNNING: RankState
RANK_SUCCEEDED: RankState
RANK_FAILED: RankState
RANK_STOPPED: RankState
FAULT_SOURCE_UNSPECIFIED: FaultSource
SOURCE_AGENT: FaultSource
SOURCE_CLIENT: FaultSource
SOURCE_LEASE: FaultSource
REPORT_KIND_UNSPECIFIED: ReportKind
REPORT_STOP_COMPLETE: ReportKind
REPORT_STRATEGIES: ReportKind
REPORT_RECOVER_STATUS: ReportKind
PHASE_UNSPECIFIED: Phase
PHASE_COLLECTING: Phase
PHASE_STOPPING: Phase
PHASE_GLOBAL_FAULT: Phase
PHASE_DECIDING: Phase
PHASE_RECOVERING: Phase
PHASE_DONE: Phase
PHASE_FAILED: Phase
COMMAND_ACTION_UNSPECIFIED: CommandAction
ACTION_RESTART_RANKS: CommandAction
ACTION_RESTART_ALL: CommandAction
ACTION_STOP_ALL: CommandAction

class Policy(_message.Message):
    __slots__ = ("max_job_restarts", "max_rank_restarts", "restart_window_s", "strategies")
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAX_JOB_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESTART_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    strategies: _containers.RepeatedScalarFieldContainer[str]
    max_rank_restarts: int
    max_job_restarts: int
    restart_window_s: float
    def __init__(self, strategies: _Iterable[str] | None = ..., max_rank_restarts: int | None = ..., max_job_restarts: int | None = ..., restart_window_s: float | None = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("created_at", "created_by", "master_addr", "master_port", "name", "nnodes", "nproc_per_node", "policy", "uid", "world_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    NPROC_PER_NODE_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_BY_FIELD_NUMBER: _ClassVar[int]
    name: str
    uid: str
    world_size: int
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    policy: Policy
    created_at: _timestamp_pb2.Timestamp
    created_by: str
    def __init__(self, name: str | None = ..., uid: str | None = ..., world_size: int | None = ..., nnodes: int | None = ..., nproc_per_node: int | None = ..., master_addr: str | None = ..., master_port: int | None = ..., policy: Policy | _Mapping | None = ..., created_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., created_by: str | None = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("finished_at", "reason", "state", "uid")
    UID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    uid: str
    state: JobState
    reason: str
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, uid: str | None = ..., state: JobState | str | None = ..., reason: str | None = ..., finished_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("agent_pid", "host", "is_spare", "node", "node_rank", "ranks", "registered_at")
    NODE_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    IS_SPARE_FIELD_NUMBER: _ClassVar[int]
    node: str
    node_rank: int
    host: str
    agent_pid: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    registered_at: _timestamp_pb2.Timestamp
    is_spare: bool
    def __init__(self, node: str | None = ..., node_rank: int | None = ..., host: str | None = ..., agent_pid: int | None = ..., ranks: _Iterable[int] | None = ..., registered_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., is_spare: bool | None = ...) -> None: ...

class RankStatus(_message.Message):
    __slots__ = ("exit_code", "generation", "local_rank", "node", "pid", "rank", "restart_count", "signal", "started_at", "state")
    RANK_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    local_rank: int
    pid: int
    state: RankState
    generation: int
    restart_count: int
    exit_code: int
    signal: int
    started_at: _timestamp_pb2.Timestamp
    node: str
    def __init__(self, rank: int | None = ..., local_rank: int | None = ..., pid: int | None = ..., state: RankState | str | None = ..., generation: int | None = ..., restart_count: int | None = ..., exit_code: int | None = ..., signal: int | None = ..., started_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., node: str | None = ...) -> None: ...

class NodeRanks(_message.Message):
    __slots__ = ("node", "ranks", "updated_at")
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    node: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankStatus]
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, node: str | None = ..., ranks: _Iterable[RankStatus | _Mapping] | None = ..., updated_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ...) -> None: ...

class Fault(_message.Message):
    __slots__ = ("detail", "detected_at", "exit_code", "fault_id", "fault_type", "generation", "node", "rank", "signal", "source", "stderr_tail")
    FAULT_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    FAULT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_FIELD_NUMBER: _ClassVar[int]
    STDERR_TAIL_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    DETECTED_AT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    fault_id: str
    rank: int
    node: str
    fault_type: str
    source: FaultSource
    exit_code: int
    signal: int
    stderr_tail: str
    generation: int
    detected_at: _timestamp_pb2.Timestamp
    detail: str
    def __init__(self, fault_id: str | None = ..., rank: int | None = ..., node: str | None = ..., fault_type: str | None = ..., source: FaultSource | str | None = ..., exit_code: int | None = ..., signal: int | None = ..., stderr_tail: str | None = ..., generation: int | None = ..., detected_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., detail: str | None = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("code", "epoch", "fault_ranks", "kind", "message", "participant", "reported_at", "strategies", "strategy", "uuid")
    PARTICIPANT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    FAULT_RANKS_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    participant: str
    epoch: int
    uuid: str
    kind: ReportKind
    code: int
    message: str
    strategies: _containers.RepeatedScalarFieldContainer[str]
    strategy: str
    fault_ranks: _containers.RepeatedScalarFieldContainer[int]
    reported_at: _timestamp_pb2.Timestamp
    def __init__(self, participant: str | None = ..., epoch: int | None = ..., uuid: str | None = ..., kind: ReportKind | str | None = ..., code: int | None = ..., message: str | None = ..., strategies: _Iterable[str] | None = ..., strategy: str | None = ..., fault_ranks: _Iterable[int] | None = ..., reported_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ...) -> None: ...

class PhaseEntry(_message.Message):
    __slots__ = ("at", "epoch", "phase")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    at: _timestamp_pb2.Timestamp
    epoch: int
    def __init__(self, phase: Phase | str | None = ..., at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., epoch: int | None = ...) -> None: ...

class FailedStrategy(_message.Message):
    __slots__ = ("reason", "strategy")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    reason: str
    def __init__(self, strategy: str | None = ..., reason: str | None = ...) -> None: ...

class Recovery(_message.Message):
    __slots__ = ("command_seq", "deadline_at", "decision_reasons", "epoch", "failed_strategies", "faults", "has_supported", "opened_at", "outcome", "participants", "phase", "phase_log", "recovery_id", "reported", "strategy", "supported", "uuid")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_AT_FIELD_NUMBER: _ClassVar[int]
    FAULTS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    DECISION_REASONS_FIELD_NUMBER: _ClassVar[int]
    FAILED_STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    PHASE_LOG_FIELD_NUMBER: _ClassVar[int]
    COMMAND_SEQ_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ID_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    HAS_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    uuid: str
    phase: Phase
    opened_at: _timestamp_pb2.Timestamp
    deadline_at: _timestamp_pb2.Timestamp
    faults: _containers.RepeatedCompositeFieldContainer[Fault]
    participants: _containers.RepeatedScalarFieldContainer[str]
    strategy: str
    decision_reasons: _containers.RepeatedScalarFieldContainer[str]
    failed_strategies: _containers.RepeatedCompositeFieldContainer[FailedStrategy]
    phase_log: _containers.RepeatedCompositeFieldContainer[PhaseEntry]
    command_seq: int
    outcome: str
    recovery_id: int
    reported: _containers.RepeatedScalarFieldContainer[str]
    has_supported: bool
    supported: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: int | None = ..., uuid: str | None = ..., phase: Phase | str | None = ..., opened_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., deadline_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., faults: _Iterable[Fault | _Mapping] | None = ..., participants: _Iterable[str] | None = ..., strategy: str | None = ..., decision_reasons: _Iterable[str] | None = ..., failed_strategies: _Iterable[FailedStrategy | _Mapping] | None = ..., phase_log: _Iterable[PhaseEntry | _Mapping] | None = ..., command_seq: int | None = ..., outcome: str | None = ..., recovery_id: int | None = ..., reported: _Iterable[str] | None = ..., has_supported: bool | None = ..., supported: _Iterable[str] | None = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("allowed", "candidates", "decided_at", "decided_by", "epoch", "expected_cost_s", "failed_strategies", "fault_ranks", "give_up", "reasons", "strategy")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    GIVE_UP_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    FAULT_RANKS_FIELD_NUMBER: _ClassVar[int]
    FAILED_STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    DECIDED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COST_S_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    strategy: str
    reasons: _containers.RepeatedScalarFieldContainer[str]
    give_up: bool
    allowed: _containers.RepeatedScalarFieldContainer[str]
    candidates: _containers.RepeatedScalarFieldContainer[str]
    fault_ranks: _containers.RepeatedScalarFieldContainer[int]
    failed_strategies: _containers.RepeatedScalarFieldContainer[str]
    decided_at: _timestamp_pb2.Timestamp
    decided_by: str
    expected_cost_s: float
    def __init__(self, epoch: int | None = ..., strategy: str | None = ..., reasons: _Iterable[str] | None = ..., give_up: bool | None = ..., allowed: _Iterable[str] | None = ..., candidates: _Iterable[str] | None = ..., fault_ranks: _Iterable[int] | None = ..., failed_strategies: _Iterable[str] | None = ..., decided_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., decided_by: str | None = ..., expected_cost_s: float | None = ...) -> None: ...

class RecoveryOutcome(_message.Message):
    __slots__ = ("closed_at", "epoch", "ok", "opened_at", "ranks", "strategy")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    strategy: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    opened_at: _timestamp_pb2.Timestamp
    closed_at: _timestamp_pb2.Timestamp
    ok: bool
    def __init__(self, epoch: int | None = ..., strategy: str | None = ..., ranks: _Iterable[int] | None = ..., opened_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., closed_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., ok: bool | None = ...) -> None: ...

class History(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[RecoveryOutcome]
    def __init__(self, outcomes: _Iterable[RecoveryOutcome | _Mapping] | None = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("action", "epoch", "issued_at", "ranks", "seq", "strategy")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ISSUED_AT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    action: CommandAction
    ranks: _containers.RepeatedScalarFieldContainer[int]
    strategy: str
    issued_at: _timestamp_pb2.Timestamp
    def __init__(self, epoch: int | None = ..., seq: int | None = ..., action: CommandAction | str | None = ..., ranks: _Iterable[int] | None = ..., strategy: str | None = ..., issued_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("detail", "done_at", "epoch", "ok", "pids", "seq")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    DONE_AT_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    seq: int
    ok: bool
    detail: str
    done_at: _timestamp_pb2.Timestamp
    pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: int | None = ..., seq: int | None = ..., ok: bool | None = ..., detail: str | None = ..., done_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., pids: _Iterable[int] | None = ...) -> None: ...

class FaultRankWire(_message.Message):
    __slots__ = ("fault_type", "rank_id")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    FAULT_TYPE_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    fault_type: str
    def __init__(self, rank_id: str | None = ..., fault_type: str | None = ...) -> None: ...

class Signal(_message.Message):
    __slots__ = ("actions", "change_strategy", "epoch", "extra_params", "fault_ranks", "node_rank_ids", "sent_at", "seq", "signal_type", "timeout", "uuid")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    SIGNAL_TYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    FAULT_RANKS_FIELD_NUMBER: _ClassVar[int]
    CHANGE_STRATEGY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_IDS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_PARAMS_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    epoch: int
    uuid: str
    signal_type: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    fault_ranks: _containers.RepeatedCompositeFieldContainer[FaultRankWire]
    change_strategy: str
    timeout: int
    node_rank_ids: _containers.RepeatedScalarFieldContainer[str]
    extra_params: str
    sent_at: _timestamp_pb2.Timestamp
    def __init__(self, seq: int | None = ..., epoch: int | None = ..., uuid: str | None = ..., signal_type: str | None = ..., actions: _Iterable[str] | None = ..., fault_ranks: _Iterable[FaultRankWire | _Mapping] | None = ..., change_strategy: str | None = ..., timeout: int | None = ..., node_rank_ids: _Iterable[str] | None = ..., extra_params: str | None = ..., sent_at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("at", "data", "epoch", "message", "node", "phase", "rank", "reason", "source")
    class DataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: str | None = ..., value: str | None = ...) -> None: ...
    AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    source: str
    reason: str
    message: str
    epoch: int
    phase: str
    rank: int
    node: str
    data: _containers.ScalarMap[str, str]
    def __init__(self, at: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ..., source: str | None = ..., reason: str | None = ..., message: str | None = ..., epoch: int | None = ..., phase: str | None = ..., rank: int | None = ..., node: str | None = ..., data: _Mapping[str, str] | None = ...) -> None: ...

class Leader(_message.Message):
    __slots__ = ("holder", "host", "pid", "since")
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    holder: str
    host: str
    pid: int
    since: _timestamp_pb2.Timestamp
    def __init__(self, holder: str | None = ..., host: str | None = ..., pid: int | None = ..., since: datetime.datetime | _timestamp_pb2.Timestamp | _Mapping | None = ...) -> None: ...
