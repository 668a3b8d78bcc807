"""Adapters: implementations of the storage ports (``bus.storage``)."""
