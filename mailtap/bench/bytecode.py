"""mailtap's modules compiled to bytecode before a bench spawns a component.

``pip install`` compiles every module (the image has ``__pycache__``); a checkout run with
PYTHONDONTWRITEBYTECODE=1 (the image's setting, and this machine's) compiles them again at every
start instead, 0.1-0.2 s of a start-up that a deployed component does not pay. A bench that
times a start (``bench startup``, ``bench ingest``'s ``first_event_s``) compiles first.
"""

from __future__ import annotations

import compileall

from mailtap.dev.layout import REPO_ROOT


def compile_ahead() -> bool:
    """Bytecode for mailtap's modules, as the image has it (True when all compiled)."""
    return all(
        compileall.compile_dir(REPO_ROOT / package, quiet=2)
        for package in ("connectors", "streams", "mailtap")
    )
