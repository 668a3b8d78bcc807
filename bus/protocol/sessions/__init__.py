"""Sessions: per-key order on unordered queues.

* ``order`` - numbered copies, the session row, a copy set aside until its turn, gaps.
* ``admin`` - an endpoint's sessions for operators and maintenance: list, show, skip, close.
"""
