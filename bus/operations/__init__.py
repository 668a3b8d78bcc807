"""Operator tools: the ``python -m bus`` command line and what it is built from.

* ``apps``: find the bus an app module defines (``function_app`` by default).
* ``topology_file``: the topology file (``infra/topology.json``) that the Bicep deploys.
* ``cli``: the click command group (``python -m bus topology export|show|check``).
* ``infra_check``: ``make infra-check``, the offline checks of ``infra/``.
"""
