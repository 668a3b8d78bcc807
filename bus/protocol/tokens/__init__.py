"""Inbox tokens: what the sender creates before any signal, and what a copy's token means.

A token is one row per message copy in flight; the receiver's check of it (R4) is what
turns at-least-once delivery into exactly-once effect.

* ``inbox``   - the token table: create, fence, poison, consume, read; tokens of many copies at
                once.
* ``verdict`` - what a token's state means for a copy that arrives now: the one place it is
                decided.
* ``shards``  - which table partition a token lies in: an endpoint's tokens spread over several,
                each attempt id naming its own.
* ``marklog`` - the send marks' log: which marks a marked send made, due when their retention
                has passed, so that the sweeper finds old marks without reading them all.
"""
