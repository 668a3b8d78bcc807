"""An app over the in-memory backend, for commands that only need an app to load (the
dashboard's start-up checks)."""

from __future__ import annotations

from bus import Bus, Command, Context, Endpoint
from bus.testing import InMemoryStorage


class Note(Command):
    ref: str


desk = Endpoint("desk")


@desk.handles(Note, partition=lambda m: m.ref)
def note(message: Note, ctx: Context) -> None:
    ctx.state.put("note", {"ref": message.ref})


bus = Bus(InMemoryStorage(), [desk])
bus.provision()
