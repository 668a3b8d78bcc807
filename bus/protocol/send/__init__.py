"""Sending from outside a handler: a client, a script, a Spark job.

* ``sender``   - one send: token first, then the signal.
* ``group``    - concurrent sends of one process sharing their requests.
* ``ledger``   - sending once per message id: the sender's own outbox.
* ``marked``   - many messages at once, each once per message id: tokens with send marks.
* ``counters`` - sequence numbers of a client's sends to handlers with sessions.
"""
