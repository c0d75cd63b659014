"""The anchors the benchmarks compare hfcache with (docs/benchmarks.md), and the conditions every figure is printed with.

``--anchors venv`` (the default) runs huggingface_hub and its ``hf`` CLI from a separate virtual environment that this
module creates once with ``pip install huggingface_hub`` (default folder /tmp/hfcache-bench-venv, or
``HFCACHE_BENCH_VENV``) and reuses after that, so the anchors are the released library, not whatever the project's
venv pins. ``--anchors current`` uses the running interpreter's environment instead (no install, no network).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEFAULT_VENV = Path(os.environ.get("HFCACHE_BENCH_VENV", "/tmp/hfcache-bench-venv"))


def anchor_python(choice: str) -> Path:
    """The python whose environment has the anchors (``huggingface_hub`` and ``hf``); creates the venv if needed.

    Args:
        choice: "venv" (a separate venv, made once) or "current" (this interpreter).

    Raises:
        SystemExit: the venv cannot be created or pip fails (its output is shown).
    """
    if choice == "current":
        return Path(sys.executable)
    python = DEFAULT_VENV / "bin" / "python"
    if not (DEFAULT_VENV / "bin" / "hf").exists():
        print(f"anchors: creating {DEFAULT_VENV} (pip install huggingface_hub), once", file=sys.stderr)
        for cmd in ([sys.executable, "-m", "venv", str(DEFAULT_VENV)],
                    [str(python), "-m", "pip", "install", "-q", "huggingface_hub"]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"anchors: {' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return python


def anchor_version(python: Path) -> str:
    """huggingface_hub's version in the anchors' environment."""
    return subprocess.run([str(python), "-c", "import huggingface_hub; print(huggingface_hub.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, as printed with every figure (the machine is shared)."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def precompile(root: Path) -> None:
    """Write hfcache's bytecode before timing, as an install does (a run with PYTHONDONTWRITEBYTECODE would else
    compile every module in every timed process, which no installed hfcache does)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "hfcache")], check=True,
                   stdout=subprocess.DEVNULL, env={k: v for k, v in os.environ.items()
                                                   if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")})


def clean_python_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the variables that would make a child ignore or skip bytecode."""
    return {k: v for k, v in env.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
