"""Stand-in ranks for the launcher tests: register the pid as a real rank does, then sleep or fail."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    run_dir, mode = Path(sys.argv[1]), sys.argv[2]
    (run_dir / "pids" / str(os.getpid())).touch()
    if mode == "sleep":
        time.sleep(600)
    if mode == "fail" and os.environ["RANK"] == "1":
        sys.exit(3)
