import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

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
    SOURCE_OPERATOR: _ClassVar[FaultSource]

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
    ACTION_START_RANKS: _ClassVar[CommandAction]
    ACTION_RELEASE_RANKS: _ClassVar[CommandAction]
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
SOURCE_OPERATOR: FaultSource
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
ACTION_START_RANKS: CommandAction
ACTION_RELEASE_RANKS: CommandAction

class Policy(_message.Message):
    __slots__ = ("strategies", "max_rank_restarts", "max_job_restarts", "restart_window_s", "deadlines", "budgets", "spares", "allow_rank0_in_place", "hang", "independent_ranks")
    class BudgetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Budget
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Budget, _Mapping]] = ...) -> None: ...
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    MAX_RANK_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    MAX_JOB_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    RESTART_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINES_FIELD_NUMBER: _ClassVar[int]
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_RANK0_IN_PLACE_FIELD_NUMBER: _ClassVar[int]
    HANG_FIELD_NUMBER: _ClassVar[int]
    INDEPENDENT_RANKS_FIELD_NUMBER: _ClassVar[int]
    strategies: _containers.RepeatedScalarFieldContainer[str]
    max_rank_restarts: int
    max_job_restarts: int
    restart_window_s: float
    deadlines: PolicyDeadlines
    budgets: _containers.MessageMap[str, Budget]
    spares: _containers.RepeatedScalarFieldContainer[str]
    allow_rank0_in_place: bool
    hang: HangPolicy
    independent_ranks: bool
    def __init__(self, strategies: _Optional[_Iterable[str]] = ..., max_rank_restarts: _Optional[int] = ..., max_job_restarts: _Optional[int] = ..., restart_window_s: _Optional[float] = ..., deadlines: _Optional[_Union[PolicyDeadlines, _Mapping]] = ..., budgets: _Optional[_Mapping[str, Budget]] = ..., spares: _Optional[_Iterable[str]] = ..., allow_rank0_in_place: _Optional[bool] = ..., hang: _Optional[_Union[HangPolicy, _Mapping]] = ..., independent_ranks: _Optional[bool] = ...) -> None: ...

class HangPolicy(_message.Message):
    __slots__ = ("enabled", "timeout_s", "multiplier", "floor_s", "startup_s", "warmup_steps", "log_pattern", "straggler_ratio", "straggler_window_s")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    FLOOR_S_FIELD_NUMBER: _ClassVar[int]
    STARTUP_S_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    LOG_PATTERN_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_RATIO_FIELD_NUMBER: _ClassVar[int]
    STRAGGLER_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    timeout_s: float
    multiplier: float
    floor_s: float
    startup_s: float
    warmup_steps: int
    log_pattern: str
    straggler_ratio: float
    straggler_window_s: float
    def __init__(self, enabled: _Optional[bool] = ..., timeout_s: _Optional[float] = ..., multiplier: _Optional[float] = ..., floor_s: _Optional[float] = ..., startup_s: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., log_pattern: _Optional[str] = ..., straggler_ratio: _Optional[float] = ..., straggler_window_s: _Optional[float] = ...) -> None: ...

class PolicyDeadlines(_message.Message):
    __slots__ = ("fault_window_s", "stop_s", "strategies_s", "decide_s", "recover_s", "replacement_s")
    FAULT_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    STOP_S_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_S_FIELD_NUMBER: _ClassVar[int]
    DECIDE_S_FIELD_NUMBER: _ClassVar[int]
    RECOVER_S_FIELD_NUMBER: _ClassVar[int]
    REPLACEMENT_S_FIELD_NUMBER: _ClassVar[int]
    fault_window_s: float
    stop_s: float
    strategies_s: float
    decide_s: float
    recover_s: float
    replacement_s: float
    def __init__(self, fault_window_s: _Optional[float] = ..., stop_s: _Optional[float] = ..., strategies_s: _Optional[float] = ..., decide_s: _Optional[float] = ..., recover_s: _Optional[float] = ..., replacement_s: _Optional[float] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("max", "window_s")
    MAX_FIELD_NUMBER: _ClassVar[int]
    WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    max: int
    window_s: float
    def __init__(self, max: _Optional[int] = ..., window_s: _Optional[float] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "uid", "world_size", "nnodes", "nproc_per_node", "master_addr", "master_port", "policy", "created_at", "created_by")
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
    def __init__(self, name: _Optional[str] = ..., uid: _Optional[str] = ..., world_size: _Optional[int] = ..., nnodes: _Optional[int] = ..., nproc_per_node: _Optional[int] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., policy: _Optional[_Union[Policy, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_by: _Optional[str] = ...) -> None: ...

class JobStatus(_message.Message):
    __slots__ = ("uid", "state", "reason", "finished_at")
    UID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    uid: str
    state: JobState
    reason: str
    finished_at: _timestamp_pb2.Timestamp
    def __init__(self, uid: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class NodeRecord(_message.Message):
    __slots__ = ("node", "node_rank", "host", "agent_pid", "ranks", "registered_at", "is_spare", "strategies", "answers_for_ranks")
    NODE_FIELD_NUMBER: _ClassVar[int]
    NODE_RANK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    AGENT_PID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    IS_SPARE_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    ANSWERS_FOR_RANKS_FIELD_NUMBER: _ClassVar[int]
    node: str
    node_rank: int
    host: str
    agent_pid: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    registered_at: _timestamp_pb2.Timestamp
    is_spare: bool
    strategies: _containers.RepeatedScalarFieldContainer[str]
    answers_for_ranks: bool
    def __init__(self, node: _Optional[str] = ..., node_rank: _Optional[int] = ..., host: _Optional[str] = ..., agent_pid: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., is_spare: _Optional[bool] = ..., strategies: _Optional[_Iterable[str]] = ..., answers_for_ranks: _Optional[bool] = ...) -> None: ...

class RankStatus(_message.Message):
    __slots__ = ("rank", "local_rank", "pid", "state", "generation", "restart_count", "exit_code", "signal", "started_at", "node")
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
    def __init__(self, rank: _Optional[int] = ..., local_rank: _Optional[int] = ..., pid: _Optional[int] = ..., state: _Optional[_Union[RankState, str]] = ..., generation: _Optional[int] = ..., restart_count: _Optional[int] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., node: _Optional[str] = ...) -> None: ...

class NodeRanks(_message.Message):
    __slots__ = ("node", "ranks", "updated_at", "warm_spare_pids")
    NODE_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    WARM_SPARE_PIDS_FIELD_NUMBER: _ClassVar[int]
    node: str
    ranks: _containers.RepeatedCompositeFieldContainer[RankStatus]
    updated_at: _timestamp_pb2.Timestamp
    warm_spare_pids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, node: _Optional[str] = ..., ranks: _Optional[_Iterable[_Union[RankStatus, _Mapping]]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., warm_spare_pids: _Optional[_Iterable[int]] = ...) -> None: ...

class ClientRecord(_message.Message):
    __slots__ = ("client_id", "role", "host", "pid", "ranks", "registered_at")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    role: str
    host: str
    pid: int
    ranks: _containers.RepeatedScalarFieldContainer[int]
    registered_at: _timestamp_pb2.Timestamp
    def __init__(self, client_id: _Optional[str] = ..., role: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., ranks: _Optional[_Iterable[int]] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Fault(_message.Message):
    __slots__ = ("fault_id", "rank", "node", "fault_type", "source", "exit_code", "signal", "stderr_tail", "generation", "detected_at", "detail", "kind", "stacks")
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
    KIND_FIELD_NUMBER: _ClassVar[int]
    STACKS_FIELD_NUMBER: _ClassVar[int]
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
    kind: str
    stacks: _containers.RepeatedCompositeFieldContainer[RankStack]
    def __init__(self, fault_id: _Optional[str] = ..., rank: _Optional[int] = ..., node: _Optional[str] = ..., fault_type: _Optional[str] = ..., source: _Optional[_Union[FaultSource, str]] = ..., exit_code: _Optional[int] = ..., signal: _Optional[int] = ..., stderr_tail: _Optional[str] = ..., generation: _Optional[int] = ..., detected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., detail: _Optional[str] = ..., kind: _Optional[str] = ..., stacks: _Optional[_Iterable[_Union[RankStack, _Mapping]]] = ...) -> None: ...

class RankStack(_message.Message):
    __slots__ = ("rank", "pid", "tool", "text", "error", "where")
    RANK_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WHERE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    pid: int
    tool: str
    text: str
    error: str
    where: str
    def __init__(self, rank: _Optional[int] = ..., pid: _Optional[int] = ..., tool: _Optional[str] = ..., text: _Optional[str] = ..., error: _Optional[str] = ..., where: _Optional[str] = ...) -> None: ...

class Report(_message.Message):
    __slots__ = ("participant", "epoch", "uuid", "kind", "code", "message", "strategies", "strategy", "fault_ranks", "reported_at")
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
    def __init__(self, participant: _Optional[str] = ..., epoch: _Optional[int] = ..., uuid: _Optional[str] = ..., kind: _Optional[_Union[ReportKind, str]] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., strategies: _Optional[_Iterable[str]] = ..., strategy: _Optional[str] = ..., fault_ranks: _Optional[_Iterable[int]] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class PhaseEntry(_message.Message):
    __slots__ = ("phase", "at", "epoch")
    PHASE_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    phase: Phase
    at: _timestamp_pb2.Timestamp
    epoch: int
    def __init__(self, phase: _Optional[_Union[Phase, str]] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class FailedStrategy(_message.Message):
    __slots__ = ("strategy", "reason")
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    strategy: str
    reason: str
    def __init__(self, strategy: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class Recovery(_message.Message):
    __slots__ = ("epoch", "uuid", "phase", "opened_at", "deadline_at", "faults", "participants", "strategy", "decision_reasons", "failed_strategies", "phase_log", "command_seq", "outcome", "recovery_id", "reported", "has_supported", "supported", "command_nodes", "job_nodes", "isolated", "held_nodes")
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
    COMMAND_NODES_FIELD_NUMBER: _ClassVar[int]
    JOB_NODES_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    HELD_NODES_FIELD_NUMBER: _ClassVar[int]
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
    command_nodes: _containers.RepeatedScalarFieldContainer[str]
    job_nodes: _containers.RepeatedScalarFieldContainer[str]
    isolated: _containers.RepeatedCompositeFieldContainer[RankPlace]
    held_nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: _Optional[int] = ..., uuid: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., faults: _Optional[_Iterable[_Union[Fault, _Mapping]]] = ..., participants: _Optional[_Iterable[str]] = ..., strategy: _Optional[str] = ..., decision_reasons: _Optional[_Iterable[str]] = ..., failed_strategies: _Optional[_Iterable[_Union[FailedStrategy, _Mapping]]] = ..., phase_log: _Optional[_Iterable[_Union[PhaseEntry, _Mapping]]] = ..., command_seq: _Optional[int] = ..., outcome: _Optional[str] = ..., recovery_id: _Optional[int] = ..., reported: _Optional[_Iterable[str]] = ..., has_supported: _Optional[bool] = ..., supported: _Optional[_Iterable[str]] = ..., command_nodes: _Optional[_Iterable[str]] = ..., job_nodes: _Optional[_Iterable[str]] = ..., isolated: _Optional[_Iterable[_Union[RankPlace, _Mapping]]] = ..., held_nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class RankPlace(_message.Message):
    __slots__ = ("rank", "node")
    RANK_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    rank: int
    node: str
    def __init__(self, rank: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class NodeMove(_message.Message):
    __slots__ = ("from_node", "to_node")
    FROM_NODE_FIELD_NUMBER: _ClassVar[int]
    TO_NODE_FIELD_NUMBER: _ClassVar[int]
    from_node: str
    to_node: str
    def __init__(self, from_node: _Optional[str] = ..., to_node: _Optional[str] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("epoch", "strategy", "reasons", "give_up", "allowed", "candidates", "fault_ranks", "failed_strategies", "decided_at", "decided_by", "expected_cost_s", "moves", "spares")
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
    MOVES_FIELD_NUMBER: _ClassVar[int]
    SPARES_FIELD_NUMBER: _ClassVar[int]
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
    moves: _containers.RepeatedCompositeFieldContainer[NodeMove]
    spares: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epoch: _Optional[int] = ..., strategy: _Optional[str] = ..., reasons: _Optional[_Iterable[str]] = ..., give_up: _Optional[bool] = ..., allowed: _Optional[_Iterable[str]] = ..., candidates: _Optional[_Iterable[str]] = ..., fault_ranks: _Optional[_Iterable[int]] = ..., failed_strategies: _Optional[_Iterable[str]] = ..., decided_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decided_by: _Optional[str] = ..., expected_cost_s: _Optional[float] = ..., moves: _Optional[_Iterable[_Union[NodeMove, _Mapping]]] = ..., spares: _Optional[_Iterable[str]] = ...) -> None: ...

class RecoveryOutcome(_message.Message):
    __slots__ = ("epoch", "strategy", "ranks", "opened_at", "closed_at", "ok", "recovery_id", "phase_log", "detected_at")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    OPENED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_LOG_FIELD_NUMBER: _ClassVar[int]
    DETECTED_AT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    strategy: str
    ranks: _containers.RepeatedScalarFieldContainer[int]
    opened_at: _timestamp_pb2.Timestamp
    closed_at: _timestamp_pb2.Timestamp
    ok: bool
    recovery_id: int
    phase_log: _containers.RepeatedCompositeFieldContainer[PhaseEntry]
    detected_at: _timestamp_pb2.Timestamp
    def __init__(self, epoch: _Optional[int] = ..., strategy: _Optional[str] = ..., ranks: _Optional[_Iterable[int]] = ..., opened_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., closed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ok: _Optional[bool] = ..., recovery_id: _Optional[int] = ..., phase_log: _Optional[_Iterable[_Union[PhaseEntry, _Mapping]]] = ..., detected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class History(_message.Message):
    __slots__ = ("outcomes",)
    OUTCOMES_FIELD_NUMBER: _ClassVar[int]
    outcomes: _containers.RepeatedCompositeFieldContainer[RecoveryOutcome]
    def __init__(self, outcomes: _Optional[_Iterable[_Union[RecoveryOutcome, _Mapping]]] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("epoch", "seq", "action", "ranks", "strategy", "issued_at")
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
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., action: _Optional[_Union[CommandAction, str]] = ..., ranks: _Optional[_Iterable[int]] = ..., strategy: _Optional[str] = ..., issued_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Drill(_message.Message):
    __slots__ = ("drill_id", "rank", "kind", "requested_by", "requested_at", "reason")
    DRILL_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    drill_id: str
    rank: int
    kind: str
    requested_by: str
    requested_at: _timestamp_pb2.Timestamp
    reason: str
    def __init__(self, drill_id: _Optional[str] = ..., rank: _Optional[int] = ..., kind: _Optional[str] = ..., requested_by: _Optional[str] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("epoch", "seq", "ok", "detail", "done_at", "pids")
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
    def __init__(self, epoch: _Optional[int] = ..., seq: _Optional[int] = ..., ok: _Optional[bool] = ..., detail: _Optional[str] = ..., done_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pids: _Optional[_Iterable[int]] = ...) -> None: ...

class FaultRankWire(_message.Message):
    __slots__ = ("rank_id", "fault_type")
    RANK_ID_FIELD_NUMBER: _ClassVar[int]
    FAULT_TYPE_FIELD_NUMBER: _ClassVar[int]
    rank_id: str
    fault_type: str
    def __init__(self, rank_id: _Optional[str] = ..., fault_type: _Optional[str] = ...) -> None: ...

class Signal(_message.Message):
    __slots__ = ("seq", "epoch", "uuid", "signal_type", "actions", "fault_ranks", "change_strategy", "timeout", "node_rank_ids", "extra_params", "sent_at")
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
    def __init__(self, seq: _Optional[int] = ..., epoch: _Optional[int] = ..., uuid: _Optional[str] = ..., signal_type: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., fault_ranks: _Optional[_Iterable[_Union[FaultRankWire, _Mapping]]] = ..., change_strategy: _Optional[str] = ..., timeout: _Optional[int] = ..., node_rank_ids: _Optional[_Iterable[str]] = ..., extra_params: _Optional[str] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("at", "source", "reason", "message", "epoch", "phase", "rank", "node", "data")
    class DataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
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
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., source: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., epoch: _Optional[int] = ..., phase: _Optional[str] = ..., rank: _Optional[int] = ..., node: _Optional[str] = ..., data: _Optional[_Mapping[str, str]] = ...) -> None: ...

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
    def __init__(self, holder: _Optional[str] = ..., host: _Optional[str] = ..., pid: _Optional[int] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
