"""Build the book exactly as `make book`, CI and the tests do.

``python -m dlperf.book`` runs ``jupyter-book build`` with warnings as errors,
then says which pages were executed and which came from the cache, how long it
took, and where the execution reports are when something failed.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
BUILD_FLAGS = ["-n", "-W", "--keep-going"]  # nitpicky, warnings are errors, report them all


@dataclass
class BuildResult:
    returncode: int
    seconds: float
    log: str
    executed: List[str] = field(default_factory=list)
    cached: List[str] = field(default_factory=list)
    html: Path = ROOT / "_build" / "html"

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def reports(self) -> str:
        """The tracebacks jupyter-book saved for pages whose execution failed."""
        folder = self.html / "reports"
        logs = sorted(folder.rglob("*.err.log")) if folder.exists() else []
        return "\n".join(f"--- {p.relative_to(self.html)}\n{p.read_text()}" for p in logs)


def command(root: Path = ROOT) -> List[str]:
    exe = Path(sys.executable).with_name("jupyter-book")
    return [str(exe), "build", str(root), *BUILD_FLAGS]


def build(root: Path = ROOT, echo: bool = True, env: Optional[dict] = None) -> BuildResult:
    start = time.perf_counter()
    process = subprocess.Popen(command(root), cwd=root, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if echo:
            print(line, end="", flush=True)
    process.wait()
    log = "".join(lines)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", log)  # without the terminal colours
    return BuildResult(
        returncode=process.returncode,
        seconds=time.perf_counter() - start,
        log=plain,
        executed=re.findall(r"^(\S+): Executing notebook", plain, re.M),
        cached=re.findall(r"^(\S+): Using cached notebook", plain, re.M),
        html=Path(root) / "_build" / "html",
    )


def main() -> int:
    result = build()
    print(f"==> Book build {'succeeded' if result.ok else 'FAILED'} in {result.seconds:.0f} s: "
          f"{len(result.executed)} page(s) executed, {len(result.cached)} from the cache")
    if result.ok:
        print(f"==> Open {result.html / 'index.html'}")
    elif result.reports():
        print("==> Execution reports:\n" + result.reports())
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
