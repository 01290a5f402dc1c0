"""Image build step: remove the bytecode of the pygments lexers no mailtap component loads.

exchangelib imports pygments at module level for its XML debug output (``exchangelib.util``:
``XmlLexer`` and the terminal formatter) and so loads a handful of its ~250 lexer modules; the
bytecode of the others is 3.9 MB of the image. Their sources stay, so any lexer still imports
(compiled in memory at import, since the image sets PYTHONDONTWRITEBYTECODE). Without the ews
extra there is no exchangelib and nothing to do.

    /opt/mailtap/bin/python prune_pygments_bytecode.py
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys


def main() -> int:
    if importlib.util.find_spec("exchangelib") is None:
        print("pygments lexers: no exchangelib, nothing pruned")
        return 0
    importlib.import_module("exchangelib.util")
    lexers = importlib.import_module("pygments.lexers")
    prefix = "pygments.lexers."
    keep = {name[len(prefix) :] for name in sys.modules if name.startswith(prefix)}
    keep |= {"__init__", "_mapping"}  # the package itself and its lexer registry
    cache = pathlib.Path(lexers.__file__).parent / "__pycache__"
    removed = 0
    for pyc in cache.glob("*.pyc"):
        if pyc.name.split(".", 1)[0] not in keep:
            pyc.unlink()
            removed += 1
    print(f"pygments lexers: {removed} unused .pyc removed, kept {sorted(keep)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
