from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

DESCRIPTOR: _descriptor.FileDescriptor

class Status(_message.Message):
    __slots__ = ("code", "info")
    CODE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    code: int
    info: str
    def __init__(self, code: int | None = ..., info: str | None = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("jobId", "role")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    role: str
    def __init__(self, jobId: str | None = ..., role: str | None = ...) -> None: ...

class FaultRank(_message.Message):
    __slots__ = ("faultType", "rankId")
    RANKID_FIELD_NUMBER: _ClassVar[int]
    FAULTTYPE_FIELD_NUMBER: _ClassVar[int]
    rankId: str
    faultType: str
    def __init__(self, rankId: str | None = ..., faultType: str | None = ...) -> None: ...

class ProcessManageSignal(_message.Message):
    __slots__ = ("actions", "changeStrategy", "extraParams", "faultRanks", "jobId", "nodeRankIds", "signalType", "timeout", "uuid")
    UUID_FIELD_NUMBER: _ClassVar[int]
    JOBID_FIELD_NUMBER: _ClassVar[int]
    SIGNALTYPE_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    CHANGESTRATEGY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    NODERANKIDS_FIELD_NUMBER: _ClassVar[int]
    EXTRAPARAMS_FIELD_NUMBER: _ClassVar[int]
    uuid: str
    jobId: str
    signalType: str
    actions: _containers.RepeatedScalarFieldContainer[str]
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    changeStrategy: str
    timeout: int
    nodeRankIds: _containers.RepeatedScalarFieldContainer[str]
    extraParams: str
    def __init__(self, uuid: str | None = ..., jobId: str | None = ..., signalType: str | None = ..., actions: _Iterable[str] | None = ..., faultRanks: _Iterable[FaultRank | _Mapping] | None = ..., changeStrategy: str | None = ..., timeout: int | None = ..., nodeRankIds: _Iterable[str] | None = ..., extraParams: str | None = ...) -> None: ...

class StopCompleteRequest(_message.Message):
    __slots__ = ("faultRanks", "jobId", "status")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    status: Status
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    def __init__(self, jobId: str | None = ..., status: Status | _Mapping | None = ..., faultRanks: _Iterable[FaultRank | _Mapping] | None = ...) -> None: ...

class RecoverStrategyRequest(_message.Message):
    __slots__ = ("faultRanks", "jobId", "strategies")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    strategies: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobId: str | None = ..., faultRanks: _Iterable[FaultRank | _Mapping] | None = ..., strategies: _Iterable[str] | None = ...) -> None: ...

class RecoverStatusRequest(_message.Message):
    __slots__ = ("isolateRankIds", "jobId", "status", "strategy")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ISOLATERANKIDS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    status: Status
    strategy: str
    isolateRankIds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobId: str | None = ..., status: Status | _Mapping | None = ..., strategy: str | None = ..., isolateRankIds: _Iterable[str] | None = ...) -> None: ...

class ProcessFaultRequest(_message.Message):
    __slots__ = ("faultRanks", "jobId")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    def __init__(self, jobId: str | None = ..., faultRanks: _Iterable[FaultRank | _Mapping] | None = ...) -> None: ...

class SwitchNicResponse(_message.Message):
    __slots__ = ("jobID", "msg")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    msg: str
    def __init__(self, jobID: str | None = ..., msg: str | None = ...) -> None: ...

class SwitchNicRequest(_message.Message):
    __slots__ = ("jobID",)
    JOBID_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    def __init__(self, jobID: str | None = ...) -> None: ...

class SwitchNics(_message.Message):
    __slots__ = ("jobID", "nicOps")
    class NicOpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceList
        def __init__(self, key: str | None = ..., value: DeviceList | _Mapping | None = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NICOPS_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    nicOps: _containers.MessageMap[str, DeviceList]
    def __init__(self, jobID: str | None = ..., nicOps: _Mapping[str, DeviceList] | None = ...) -> None: ...

class DeviceList(_message.Message):
    __slots__ = ("dev", "op")
    DEV_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    dev: _containers.RepeatedScalarFieldContainer[str]
    op: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, dev: _Iterable[str] | None = ..., op: _Iterable[bool] | None = ...) -> None: ...

class SwitchRankList(_message.Message):
    __slots__ = ("jobId", "op", "rankID")
    RANKID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    JOBID_FIELD_NUMBER: _ClassVar[int]
    rankID: _containers.RepeatedScalarFieldContainer[str]
    op: _containers.RepeatedScalarFieldContainer[bool]
    jobId: str
    def __init__(self, rankID: _Iterable[str] | None = ..., op: _Iterable[bool] | None = ..., jobId: str | None = ...) -> None: ...

class SwitchResult(_message.Message):
    __slots__ = ("jobId", "result")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    result: bool
    def __init__(self, jobId: str | None = ..., result: bool | None = ...) -> None: ...

class StressOpList(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ops: _Iterable[int] | None = ...) -> None: ...

class StressTestParam(_message.Message):
    __slots__ = ("allNodesOps", "jobID", "stressParam")
    class StressParamEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressOpList
        def __init__(self, key: str | None = ..., value: StressOpList | _Mapping | None = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STRESSPARAM_FIELD_NUMBER: _ClassVar[int]
    ALLNODESOPS_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    stressParam: _containers.MessageMap[str, StressOpList]
    allNodesOps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, jobID: str | None = ..., stressParam: _Mapping[str, StressOpList] | None = ..., allNodesOps: _Iterable[int] | None = ...) -> None: ...

class StressTestRequest(_message.Message):
    __slots__ = ("jobID",)
    JOBID_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    def __init__(self, jobID: str | None = ...) -> None: ...

class StressTestResponse(_message.Message):
    __slots__ = ("jobID", "msg")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    msg: str
    def __init__(self, jobID: str | None = ..., msg: str | None = ...) -> None: ...

class StressTestRankParams(_message.Message):
    __slots__ = ("jobId", "stressParam")
    class StressParamEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressOpList
        def __init__(self, key: str | None = ..., value: StressOpList | _Mapping | None = ...) -> None: ...
    STRESSPARAM_FIELD_NUMBER: _ClassVar[int]
    JOBID_FIELD_NUMBER: _ClassVar[int]
    stressParam: _containers.MessageMap[str, StressOpList]
    jobId: str
    def __init__(self, stressParam: _Mapping[str, StressOpList] | None = ..., jobId: str | None = ...) -> None: ...

class StressTestResult(_message.Message):
    __slots__ = ("jobId", "stressResult")
    class StressResultEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressTestRankResult
        def __init__(self, key: str | None = ..., value: StressTestRankResult | _Mapping | None = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STRESSRESULT_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    stressResult: _containers.MessageMap[str, StressTestRankResult]
    def __init__(self, jobId: str | None = ..., stressResult: _Mapping[str, StressTestRankResult] | None = ...) -> None: ...

class StressTestRankResult(_message.Message):
    __slots__ = ("rankResult",)
    class RankResultEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressTestOpResult
        def __init__(self, key: str | None = ..., value: StressTestOpResult | _Mapping | None = ...) -> None: ...
    RANKRESULT_FIELD_NUMBER: _ClassVar[int]
    rankResult: _containers.MessageMap[str, StressTestOpResult]
    def __init__(self, rankResult: _Mapping[str, StressTestOpResult] | None = ...) -> None: ...

class StressTestOpResult(_message.Message):
    __slots__ = ("code", "result")
    CODE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    code: str
    result: str
    def __init__(self, code: str | None = ..., result: str | None = ...) -> None: ...
