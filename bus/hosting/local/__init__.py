"""The local host: a stand-in for the Azure Functions host, for machines without Core Tools.

``python -m bus host`` (``serve``) loads an app's ``function_app.py`` into Microsoft's own
Python worker (``azure_functions_runtime``, driven in process: ``worker``, with the host's side
of its protocol in ``protos`` and ``bindings``), feeds its queue triggers with the Functions
host's queue rules (``queues``, after the host's ``QueueListener`` and ``QueueProcessor``), runs
its timer triggers, and drives Durable orchestrations through the real azure-functions-durable
replay engine, with history and instances kept in the storage account so a restarted host
resumes them (``durable``). Which parts are Microsoft's code and where this host differs from
the real one: docs/functions.md. It needs the ``functions`` extra on Python 3.13.
"""
