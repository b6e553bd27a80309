"""The bench/ programs the drivers run. CMake builds them on demand (bench/CMakeLists.txt:
the default build only checks that their sources compile), so a driver builds the one it
runs first, which also keeps it current with the headers."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def built(build, name: str) -> Path:
    """BUILD/bench/NAME after `cmake --build BUILD --target bench_NAME` (its output on stderr);
    exits naming the target when that fails."""
    target = f"bench_{name}"
    r = subprocess.run(["cmake", "--build", str(build), "--target", target], stdout=sys.stderr)
    if r.returncode != 0:
        sys.exit(f"building {target} in {build} failed (its output is above); "
                 f"configure the build first: cmake -S . -B {build} -DCMAKE_BUILD_TYPE=Release")
    return Path(build) / "bench" / name
