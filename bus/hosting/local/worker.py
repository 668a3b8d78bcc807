"""Microsoft's Python worker, driven in process by the local host as the Functions host drives it.

In Azure (Python 3.13 and later) the host starts a proxy worker that loads
``azure_functions_runtime``, the worker library the app pins in ``requirements.txt``, and
forwards the host's gRPC requests to its handlers. The local host plays host and proxy: it sends
the same requests in the same order (start the worker's thread pool, worker init - which
indexes the app -, function metadata, one load per function, then invocations) and reads the
responses. Indexing, parameter validation, binding conversion, invocation and the worker's
thread pool are the library's code; the requests and response classes are ours
(``bus.hosting.local.protos``).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import azure_functions_runtime as runtime

from bus.hosting.local import protos

log = logging.getLogger("bus.hosting.local.worker")

WORKER_PACKAGE = "azure-functions-runtime"
HOST_THREAD_COUNT = "1000"
"""What the host sets PYTHON_THREADPOOL_THREAD_COUNT to when the app does not
(azure-functions-host DefaultWorkerProcessFactory.ApplyWorkerConcurrencyLimits,
RpcWorkerConstants.DefaultConcurrencyLimit): the worker's ``min(32, cpus + 4)`` default never
applies under the real host."""


class IndexingError(Exception):
    """The worker refused the app; the message is the worker's own."""


class InvocationFailed(Exception):
    """The function raised (or its bindings could not be converted); ``str()`` is the worker's
    message, ``stack_trace`` its traceback."""

    def __init__(self, message: str, stack_trace: str) -> None:
        super().__init__(message)
        self.stack_trace = stack_trace


@dataclass(frozen=True)
class Function:
    """One function of the app as the worker described it to the host."""

    name: str
    function_id: str
    bindings: list[dict[str, Any]]

    @property
    def trigger(self) -> dict[str, Any]:
        return next(b for b in self.bindings if str(b["type"]).endswith("Trigger"))

    @property
    def trigger_type(self) -> str:
        return str(self.trigger["type"])

    def binding(self, kind: str) -> dict[str, Any] | None:
        return next((b for b in self.bindings if b["type"] == kind), None)


@dataclass
class AppIndex:
    """Every function of the app, as the worker indexed it."""

    functions: list[Function] = field(default_factory=list)

    def of_type(self, trigger_type: str) -> list[Function]:
        return [f for f in self.functions if f.trigger_type == trigger_type]

    def named(self, name: str) -> Function:
        for function in self.functions:
            if function.name == name:
                return function
        raise KeyError(name)


def worker_version() -> str:
    """``azure-functions-runtime <version>``: the worker library that runs the app."""
    return f"{WORKER_PACKAGE} {importlib.metadata.version(WORKER_PACKAGE)}"


class Worker:
    """The worker library of this process (it keeps its state in module globals: one per
    process, as in Azure, where each worker is a process of its own)."""

    def __init__(self, script_root: Path) -> None:
        self.script_root = script_root.resolve()
        self.index = AppIndex()
        self.threads = 0
        """Threads of the worker's pool for sync functions (PYTHON_THREADPOOL_THREAD_COUNT,
        which the host sets to 1000 when the app does not)."""
        self._path_saved: list[str] | None = None

    async def start(self) -> AppIndex:
        """Init (the worker indexes the app), metadata, and a load request per function.

        Raises IndexingError with the worker's message when it refuses the app: the host then
        loads no function at all.
        """
        directory = str(self.script_root)
        self._path_saved = list(sys.path)
        if directory in sys.path:
            sys.path.remove(directory)
        sys.path.insert(0, directory)  # the proxy worker puts the app first on sys.path
        sys.modules.pop("function_app", None)  # a fresh import, as in a new worker process
        os.environ.setdefault("PYTHON_THREADPOOL_THREAD_COUNT", HOST_THREAD_COUNT)
        runtime.start_threadpool_executor()
        self.threads = int(getattr(runtime.get_threadpool_executor(), "_max_workers", 0))
        init = await runtime.worker_init_request(protos.WorkerRequest(
            "WorkerInitRequest",
            protos.StreamingMessage(worker_init_request=protos.WorkerInitRequest(
                host_version="devhost", function_app_directory=directory,
                worker_directory=directory)),
            {"protos": protos, "host": "127.0.0.1"}))
        _check(init.result, "the worker refused the app")
        metadata = await runtime.functions_metadata_request(protos.WorkerRequest(
            "WorkerMetadataRequest", protos.StreamingMessage(
                functions_metadata_request=protos.FunctionsMetadataRequest(
                    function_app_directory=directory))))
        _check(metadata.result, "the worker could not describe the app's functions")
        if not metadata.function_metadata_results:
            raise IndexingError(f"the worker found no functions in {directory}/function_app.py")
        for item in metadata.function_metadata_results:
            await self._load(item)
        return self.index

    async def _load(self, metadata: protos.RpcFunctionMetadata) -> None:
        response = await runtime.function_load_request(protos.WorkerRequest(
            "FunctionLoadRequest", protos.StreamingMessage(
                function_load_request=protos.FunctionLoadRequest(
                    function_id=metadata.function_id, metadata=metadata))))
        _check(response.result, f"the worker could not load {metadata.name}")
        self.index.functions.append(Function(
            name=metadata.name, function_id=metadata.function_id,
            bindings=[json.loads(raw) for raw in metadata.raw_bindings]))

    async def invoke(self, function: Function, inputs: dict[str, protos.TypedData],
                     trigger_metadata: dict[str, protos.TypedData] | None = None, *,
                     retry_count: int = 0, max_retry_count: int = 0) -> protos.TypedData | None:
        """One invocation: the function's return value, or InvocationFailed."""
        request = protos.InvocationRequest(
            invocation_id=str(uuid.uuid4()), function_id=function.function_id,
            input_data=[protos.ParameterBinding(name=name, data=data)
                        for name, data in inputs.items()],
            trigger_metadata=trigger_metadata or {},
            trace_context=protos.RpcTraceContext(trace_parent=_traceparent()),
            retry_context=protos.RetryContext(retry_count=retry_count,
                                              max_retry_count=max_retry_count))
        response = await runtime.invocation_request(protos.WorkerRequest(
            "FunctionInvocationRequest", protos.StreamingMessage(invocation_request=request)))
        result = response.result
        if result is None or result.status != protos.StatusResult.Success:
            exception = result.exception if result else None
            raise InvocationFailed(exception.message if exception else "no result",
                                   exception.stack_trace if exception else "")
        returned: protos.TypedData | None = response.return_value
        return returned

    def stop(self) -> None:
        """Stop the thread pool; sys.path as it was (the process may index another app)."""
        runtime.stop_threadpool_executor()
        if self._path_saved is not None:
            sys.path[:] = self._path_saved


def _check(result: protos.StatusResult | None, what: str) -> None:
    if result is not None and result.status == protos.StatusResult.Success:
        return
    exception = result.exception if result else None
    detail = exception.message if exception else "no status"
    raise IndexingError(f"{what}: {detail}")


def _traceparent() -> str:
    """A W3C traceparent, as the host sends for every invocation (Activity.Current.Id): flags
    ``01``, sampled, as the host's Activity is when its telemetry records it. With ``00`` a
    parent-based sampler (the SDK's default) drops every span the app parents on the
    invocation."""
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
