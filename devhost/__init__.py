"""This repository's tools around the local host (``bus.hosting.local``, ``python -m bus host``):
Azurite started on free ports (``azurite``), the demo (``demo``), the sample dashboard
(``dashboard``), trace pictures (``trace_picture``) and the host run as a subprocess
(``process``). ``python -m devhost`` is ``python -m bus host``. A development tool: .funcignore
keeps it out of the deployed package.
"""
