"""``python -m mia_engine``. vLLM spawns its engine core, which re-imports this module: the guard
keeps the child from starting a second server."""

import sys

if __name__ == "__main__":
    from mia_engine.cli import main

    sys.exit(main())
