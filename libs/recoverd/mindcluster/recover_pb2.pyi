from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(_message.Message):
    __slots__ = ("code", "info")
    CODE_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    code: int
    info: str
    def __init__(self, code: _Optional[int] = ..., info: _Optional[str] = ...) -> None: ...

class ClientInfo(_message.Message):
    __slots__ = ("jobId", "role")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    role: str
    def __init__(self, jobId: _Optional[str] = ..., role: _Optional[str] = ...) -> None: ...

class FaultRank(_message.Message):
    __slots__ = ("rankId", "faultType")
    RANKID_FIELD_NUMBER: _ClassVar[int]
    FAULTTYPE_FIELD_NUMBER: _ClassVar[int]
    rankId: str
    faultType: str
    def __init__(self, rankId: _Optional[str] = ..., faultType: _Optional[str] = ...) -> None: ...

class ProcessManageSignal(_message.Message):
    __slots__ = ("uuid", "jobId", "signalType", "actions", "faultRanks", "changeStrategy", "timeout", "nodeRankIds", "extraParams")
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
    def __init__(self, uuid: _Optional[str] = ..., jobId: _Optional[str] = ..., signalType: _Optional[str] = ..., actions: _Optional[_Iterable[str]] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ..., changeStrategy: _Optional[str] = ..., timeout: _Optional[int] = ..., nodeRankIds: _Optional[_Iterable[str]] = ..., extraParams: _Optional[str] = ...) -> None: ...

class StopCompleteRequest(_message.Message):
    __slots__ = ("jobId", "status", "faultRanks")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    status: Status
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    def __init__(self, jobId: _Optional[str] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ...) -> None: ...

class RecoverStrategyRequest(_message.Message):
    __slots__ = ("jobId", "faultRanks", "strategies")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    STRATEGIES_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    strategies: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobId: _Optional[str] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ..., strategies: _Optional[_Iterable[str]] = ...) -> None: ...

class RecoverStatusRequest(_message.Message):
    __slots__ = ("jobId", "status", "strategy", "isolateRankIds")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ISOLATERANKIDS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    status: Status
    strategy: str
    isolateRankIds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobId: _Optional[str] = ..., status: _Optional[_Union[Status, _Mapping]] = ..., strategy: _Optional[str] = ..., isolateRankIds: _Optional[_Iterable[str]] = ...) -> None: ...

class ProcessFaultRequest(_message.Message):
    __slots__ = ("jobId", "faultRanks")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    FAULTRANKS_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    faultRanks: _containers.RepeatedCompositeFieldContainer[FaultRank]
    def __init__(self, jobId: _Optional[str] = ..., faultRanks: _Optional[_Iterable[_Union[FaultRank, _Mapping]]] = ...) -> None: ...

class SwitchNicResponse(_message.Message):
    __slots__ = ("jobID", "msg")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    msg: str
    def __init__(self, jobID: _Optional[str] = ..., msg: _Optional[str] = ...) -> None: ...

class SwitchNicRequest(_message.Message):
    __slots__ = ("jobID",)
    JOBID_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    def __init__(self, jobID: _Optional[str] = ...) -> None: ...

class SwitchNics(_message.Message):
    __slots__ = ("jobID", "nicOps")
    class NicOpsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: DeviceList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[DeviceList, _Mapping]] = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    NICOPS_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    nicOps: _containers.MessageMap[str, DeviceList]
    def __init__(self, jobID: _Optional[str] = ..., nicOps: _Optional[_Mapping[str, DeviceList]] = ...) -> None: ...

class DeviceList(_message.Message):
    __slots__ = ("dev", "op")
    DEV_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    dev: _containers.RepeatedScalarFieldContainer[str]
    op: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, dev: _Optional[_Iterable[str]] = ..., op: _Optional[_Iterable[bool]] = ...) -> None: ...

class SwitchRankList(_message.Message):
    __slots__ = ("rankID", "op", "jobId")
    RANKID_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    JOBID_FIELD_NUMBER: _ClassVar[int]
    rankID: _containers.RepeatedScalarFieldContainer[str]
    op: _containers.RepeatedScalarFieldContainer[bool]
    jobId: str
    def __init__(self, rankID: _Optional[_Iterable[str]] = ..., op: _Optional[_Iterable[bool]] = ..., jobId: _Optional[str] = ...) -> None: ...

class SwitchResult(_message.Message):
    __slots__ = ("jobId", "result")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    result: bool
    def __init__(self, jobId: _Optional[str] = ..., result: _Optional[bool] = ...) -> None: ...

class StressOpList(_message.Message):
    __slots__ = ("ops",)
    OPS_FIELD_NUMBER: _ClassVar[int]
    ops: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ops: _Optional[_Iterable[int]] = ...) -> None: ...

class StressTestParam(_message.Message):
    __slots__ = ("jobID", "stressParam", "allNodesOps")
    class StressParamEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressOpList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StressOpList, _Mapping]] = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STRESSPARAM_FIELD_NUMBER: _ClassVar[int]
    ALLNODESOPS_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    stressParam: _containers.MessageMap[str, StressOpList]
    allNodesOps: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, jobID: _Optional[str] = ..., stressParam: _Optional[_Mapping[str, StressOpList]] = ..., allNodesOps: _Optional[_Iterable[int]] = ...) -> None: ...

class StressTestRequest(_message.Message):
    __slots__ = ("jobID",)
    JOBID_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    def __init__(self, jobID: _Optional[str] = ...) -> None: ...

class StressTestResponse(_message.Message):
    __slots__ = ("jobID", "msg")
    JOBID_FIELD_NUMBER: _ClassVar[int]
    MSG_FIELD_NUMBER: _ClassVar[int]
    jobID: str
    msg: str
    def __init__(self, jobID: _Optional[str] = ..., msg: _Optional[str] = ...) -> None: ...

class StressTestRankParams(_message.Message):
    __slots__ = ("stressParam", "jobId")
    class StressParamEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressOpList
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StressOpList, _Mapping]] = ...) -> None: ...
    STRESSPARAM_FIELD_NUMBER: _ClassVar[int]
    JOBID_FIELD_NUMBER: _ClassVar[int]
    stressParam: _containers.MessageMap[str, StressOpList]
    jobId: str
    def __init__(self, stressParam: _Optional[_Mapping[str, StressOpList]] = ..., jobId: _Optional[str] = ...) -> None: ...

class StressTestResult(_message.Message):
    __slots__ = ("jobId", "stressResult")
    class StressResultEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressTestRankResult
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StressTestRankResult, _Mapping]] = ...) -> None: ...
    JOBID_FIELD_NUMBER: _ClassVar[int]
    STRESSRESULT_FIELD_NUMBER: _ClassVar[int]
    jobId: str
    stressResult: _containers.MessageMap[str, StressTestRankResult]
    def __init__(self, jobId: _Optional[str] = ..., stressResult: _Optional[_Mapping[str, StressTestRankResult]] = ...) -> None: ...

class StressTestRankResult(_message.Message):
    __slots__ = ("rankResult",)
    class RankResultEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: StressTestOpResult
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[StressTestOpResult, _Mapping]] = ...) -> None: ...
    RANKRESULT_FIELD_NUMBER: _ClassVar[int]
    rankResult: _containers.MessageMap[str, StressTestOpResult]
    def __init__(self, rankResult: _Optional[_Mapping[str, StressTestOpResult]] = ...) -> None: ...

class StressTestOpResult(_message.Message):
    __slots__ = ("code", "result")
    CODE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    code: str
    result: str
    def __init__(self, code: _Optional[str] = ..., result: _Optional[str] = ...) -> None: ...
