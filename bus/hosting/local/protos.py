"""The host's side of the Functions worker protocol: the messages the Python worker reads and
builds, written for the local host.

The Functions host and its worker exchange protobuf messages defined in
azure-functions-language-worker-protobuf (``FunctionRpc.proto``). Microsoft's Python worker
(``azure_functions_runtime``) receives the generated message classes from its caller as a
``protos`` namespace and uses them as plain objects: it reads fields, builds responses with
keyword arguments, compares enum values and calls ``WhichOneof`` on the two ``oneof`` fields
it reads. This module provides exactly that, for the messages and fields the worker uses and
with the proto's field names and enum numbers, so the local host can hand the worker its requests
in process instead of over gRPC. Like generated classes, constructors refuse fields the proto
does not declare, and unset fields read as the proto's defaults.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any


def _oneof(message: Any, names: tuple[str, ...], group: str) -> str | None:
    chosen = [name for name in names if getattr(message, name) is not None]
    if len(chosen) > 1:
        raise ValueError(f"{type(message).__name__}.{group} has several fields set: {chosen}")
    return chosen[0] if chosen else None


# -- shared -------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class RpcException:
    source: str = ""
    stack_trace: str = ""
    message: str = ""
    is_user_exception: bool = False


@dataclass(kw_only=True)
class StatusResult:
    Failure = 0
    Success = 1
    Cancelled = 2

    status: int = Failure
    result: str = ""
    exception: RpcException | None = None
    logs: list[Any] = field(default_factory=list)


@dataclass(kw_only=True)
class CollectionString:
    string: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class TypedData:
    """``oneof data``: exactly one of the fields is set (or none)."""

    ONEOF = ("string", "json", "bytes", "stream", "http", "int", "double", "collection_bytes",
             "collection_string", "collection_double", "collection_sint64",
             "model_binding_data", "collection_model_binding_data")

    string: str | None = None
    json: str | None = None
    bytes: builtins.bytes | None = None
    stream: builtins.bytes | None = None
    http: Any = None
    int: builtins.int | None = None
    double: float | None = None
    collection_bytes: Any = None
    collection_string: CollectionString | None = None
    collection_double: Any = None
    collection_sint64: Any = None
    model_binding_data: Any = None
    collection_model_binding_data: Any = None

    def __post_init__(self) -> None:
        _oneof(self, self.ONEOF, "data")

    def WhichOneof(self, group: str) -> str | None:  # noqa: N802 - protobuf's name
        if group != "data":
            raise ValueError(f"TypedData has no oneof {group!r}")
        return _oneof(self, self.ONEOF, group)


@dataclass(kw_only=True)
class ParameterBinding:
    """``oneof rpc_data``: the local host only sends ``data`` (no shared memory)."""

    name: str = ""
    data: TypedData | None = None
    rpc_shared_memory: Any = None

    def WhichOneof(self, group: str) -> str | None:  # noqa: N802 - protobuf's name
        if group != "rpc_data":
            raise ValueError(f"ParameterBinding has no oneof {group!r}")
        return _oneof(self, ("data", "rpc_shared_memory"), group)


# -- metadata (indexing) ------------------------------------------------------------------------
@dataclass(kw_only=True)
class BindingInfo:
    # Direction
    in_ = 0  # ``in`` in the proto; the worker reads only ``out`` and ``inout``
    out = 1
    inout = 2
    # DataType
    undefined = 0
    string = 1
    binary = 2
    stream = 3

    type: str = ""
    direction: int = 0
    data_type: int = 0
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class RpcRetryOptions:
    max_retry_count: int = 0
    delay_interval: dt.timedelta | None = None
    minimum_interval: dt.timedelta | None = None
    maximum_interval: dt.timedelta | None = None
    retry_strategy: str = ""


@dataclass(kw_only=True)
class RpcFunctionMetadata:
    name: str = ""
    directory: str = ""
    script_file: str = ""
    entry_point: str = ""
    bindings: dict[str, BindingInfo] = field(default_factory=dict)
    is_proxy: bool = False
    status: StatusResult | None = None
    language: str = ""
    raw_bindings: list[str] = field(default_factory=list)
    function_id: str = ""
    managed_dependency_enabled: bool = False
    retry_options: RpcRetryOptions | None = None
    properties: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class WorkerMetadata:
    runtime_name: str = ""
    runtime_version: str = ""
    worker_version: str = ""
    worker_bitness: str = ""
    custom_properties: dict[str, str] = field(default_factory=dict)


# -- requests -----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class WorkerInitRequest:
    host_version: str = ""
    capabilities: dict[str, str] = field(default_factory=dict)
    log_categories: dict[str, int] = field(default_factory=dict)
    worker_directory: str = ""
    function_app_directory: str = ""


@dataclass(kw_only=True)
class FunctionsMetadataRequest:
    function_app_directory: str = ""


@dataclass(kw_only=True)
class FunctionLoadRequest:
    function_id: str = ""
    metadata: RpcFunctionMetadata | None = None
    managed_dependency_enabled: bool = False


@dataclass(kw_only=True)
class RpcTraceContext:
    trace_parent: str = ""
    trace_state: str = ""
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(kw_only=True)
class RetryContext:
    retry_count: int = 0
    max_retry_count: int = 0
    exception: RpcException | None = None


@dataclass(kw_only=True)
class InvocationRequest:
    invocation_id: str = ""
    function_id: str = ""
    input_data: list[ParameterBinding] = field(default_factory=list)
    trigger_metadata: dict[str, TypedData] = field(default_factory=dict)
    trace_context: RpcTraceContext = field(default_factory=RpcTraceContext)
    retry_context: RetryContext = field(default_factory=RetryContext)


@dataclass(kw_only=True)
class StreamingMessage:
    """The envelope of every request; ``oneof content`` (one request set)."""

    request_id: str = ""
    worker_init_request: WorkerInitRequest | None = None
    functions_metadata_request: FunctionsMetadataRequest | None = None
    function_load_request: FunctionLoadRequest | None = None
    invocation_request: InvocationRequest | None = None


# -- responses ----------------------------------------------------------------------------------
@dataclass(kw_only=True)
class WorkerInitResponse:
    worker_version: str = ""
    capabilities: dict[str, str] = field(default_factory=dict)
    result: StatusResult | None = None
    worker_metadata: WorkerMetadata | None = None


@dataclass(kw_only=True)
class FunctionEnvironmentReloadResponse:
    worker_metadata: WorkerMetadata | None = None
    capabilities: dict[str, str] = field(default_factory=dict)
    result: StatusResult | None = None


@dataclass(kw_only=True)
class FunctionMetadataResponse:
    function_metadata_results: list[RpcFunctionMetadata] | None = None
    result: StatusResult | None = None
    use_default_metadata_indexing: bool = False


@dataclass(kw_only=True)
class FunctionLoadResponse:
    function_id: str = ""
    result: StatusResult | None = None
    is_dependency_downloaded: bool = False


@dataclass(kw_only=True)
class InvocationResponse:
    invocation_id: str = ""
    output_data: list[ParameterBinding] = field(default_factory=list)
    return_value: TypedData | None = None
    result: StatusResult | None = None


@dataclass
class WorkerRequest:
    """What Microsoft's proxy worker hands the worker library for each request: its name, the
    StreamingMessage, and (for init) ``{"protos": <this module>, "host": <address>}``."""

    name: str
    request: StreamingMessage
    properties: dict[str, Any] | None = None


MESSAGE_CLASSES = tuple(value for value in list(globals().values())
                        if dataclasses.is_dataclass(value) and isinstance(value, type))
