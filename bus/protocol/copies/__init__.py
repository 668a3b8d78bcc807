"""Putting one copy of a message on its way, and what a copy carries.

* ``courier``      - one copy: its token, its claim-check payload, its signal.
* ``sealing``      - a copy encrypted and signed as it is made; checked and opened on receipt.
* ``payloads``     - claim-check blobs for payloads too large for a queue message.
* ``bundles``      - several signals for one queue in one queue message.
* ``topics``       - recipient lists in blobs, changed by ETag compare-and-swap.
* ``backpressure`` - bounded queues and a bound on sends in flight.
"""
