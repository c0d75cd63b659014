"""The network filter's probe for doctor (hfcache/offline/doctor.py) and exec's `{NAME}` substitution.

The probe runs in a forked child: doctor's own process must stay unfiltered (a seccomp filter cannot be removed).
Where the kernel refuses the filter (an outer filter making seccomp/prctl fail), the finding is a warning naming
why; under `exec --no-network` the probe still works (filters stack) and says a filter is in force.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from hfcache.offline.doctor import enforcement_findings
from hfcache.offline.exec_paths import substitute_paths
from hfcache.offline.sandbox import filter_problem, libseccomp_version
from tests.helpers import clean_env

FINDINGS_PY = ("import json; from hfcache.offline.doctor import enforcement_findings; "
               "print(json.dumps([f.__dict__ for f in enforcement_findings()]))")
LAUNCHER_PY = textwrap.dedent("""
    import errno, os, sys
    import pyseccomp as seccomp
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for call in ("seccomp", "prctl"):
        rules.add_rule(seccomp.ERRNO(errno.EPERM), call)
    rules.load()
    os.execv(sys.argv[1], sys.argv[1:])
""")


def _status() -> dict[str, str]:
    text = Path("/proc/self/status").read_text(encoding="ascii")
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_probe_reports_the_filter_available_and_leaves_this_process_unfiltered():
    before = _status()["Seccomp"]
    findings = enforcement_findings()
    assert [(f.code, f.severity) for f in findings] == [("offline.network_filter", "info")]
    assert findings[0].message == ("process-tree network filter (exec --no-network): available "
                                   f"(seccomp, libseccomp {libseccomp_version()})")
    assert _status()["Seccomp"] == before  # the filter went into the forked child only
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    assert filter_problem() is not None  # and this process is not under it


def test_probe_names_why_where_the_kernel_refuses_the_filter(tmp_path: Path):
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER_PY, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(launcher), sys.executable, "-c", FINDINGS_PY], capture_output=True,
                          text=True, env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    [finding] = json.loads(proc.stdout)
    assert finding["code"] == "offline.network_filter" and finding["severity"] == "warning"
    assert finding["message"].startswith("process-tree network filter (exec --no-network): unavailable: the "
                                         "kernel refused the network filter (E"), finding
    assert "exec --no-network refuses to start here" in finding["fix"]


def test_probe_under_exec_no_network_says_a_filter_is_in_force(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "hfcache", "exec", "--cache-dir", str(tmp_path / "c"),
                           "--no-network", "--", sys.executable, "-c", FINDINGS_PY], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    found = {f["code"]: f for f in json.loads(proc.stdout)}
    assert found["offline.network_filter"]["severity"] == "info"  # filters stack: it can be loaded once more
    assert found["offline.network_filter_active"]["severity"] == "info"


def test_substitution_is_one_pass_and_leaves_the_program_and_other_braces_alone():
    paths = {"A": "/c/snap/{B}.gguf", "B": "/c/b"}
    assert substitute_paths(["{A}", "-m", "{A}", "x={B}", "{C}", "{}", "{{A}}"], paths) == (
        "{A}", "-m", "/c/snap/{B}.gguf", "x=/c/b", "{C}", "{}", "{/c/snap/{B}.gguf}")
