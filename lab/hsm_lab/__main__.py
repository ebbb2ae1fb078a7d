"""``python -m hsm_lab <command> ...``: the lab's commands, the same as ``python -m hsm <command>``."""
from __future__ import annotations

import sys

from hsm.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
