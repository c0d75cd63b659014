"""doctor: which network enforcement this machine and container allow for ``hfcache exec``.

The process-tree filter (``exec --no-network``, :mod:`.sandbox`) is tried in a forked child, never in doctor's own
process (a seccomp filter cannot be removed). The Python guard (``exec``'s default) needs nothing from the kernel
and is always available; it is not reported.
"""

from __future__ import annotations

from .findings import Finding
from .sandbox import probe_filter

LABEL = "process-tree network filter (exec --no-network)"


def enforcement_findings() -> list[Finding]:
    """Findings on the process-tree network filter here.

    Returns:
        list[Finding]: ``offline.network_filter`` (info when the filter loads and is in force in a child:
        ``available (seccomp, libseccomp X.Y.Z)``; warning with the reason and a fix when it cannot be used, since
        ``exec --no-network`` would then refuse to start); plus ``offline.network_filter_active`` (info) when doctor
        itself already runs where IP sockets are refused (under ``exec --no-network`` or a sandbox like it).
    """
    probe = probe_filter()
    findings = []
    if probe.available:
        findings.append(Finding("offline.network_filter", "info", f"{LABEL}: available ({probe.detail})"))
    else:
        findings.append(Finding(
            "offline.network_filter", "warning", f"{LABEL}: unavailable: {probe.detail}",
            fix="exec --no-network refuses to start here; install libseccomp (libseccomp2), and in a container "
                "allow seccomp(2)/prctl(2) (e.g. the runtime's default seccomp profile, not one that blocks them); "
                "else rely on the Python guard and a NetworkPolicy (docs/offline.md)"))
    if probe.already_denied:
        findings.append(Finding("offline.network_filter_active", "info",
                                "this process cannot create IP sockets: a network filter is in force "
                                "(exec --no-network or a sandbox like it)"))
    return findings
