"""A local stand-in for the Azure Functions host, for machines without Core Tools.

``python -m devhost`` indexes ``function_app.py`` the way the Python worker does, polls the
queue triggers with the host's documented queue semantics, runs timer triggers, and drives
Durable orchestrations through the real azure-functions-durable replay engine, with history
and instances kept in the storage account (so a restarted devhost resumes them). It is a
development tool: .funcignore keeps it out of the deployed package.
"""
