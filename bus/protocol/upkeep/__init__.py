"""Upkeep: collecting what crashes leave behind.

* ``sweeper`` - the documented orphan-cleanup rule, run on a timer.
"""
