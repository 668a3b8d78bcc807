"""Hosting: running endpoints. ``worker`` polls queues the way the Functions host does."""
