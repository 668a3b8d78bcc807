"""Poison: a copy set aside with its reason, and what operators do with it.

* ``queue``       - the poison queue's entries.
* ``poisoning``   - poisoning a signal: the entry with the reason, its token poisoned.
* ``poisoned`` - listing, replaying (exactly once) and purging the entries.
"""
