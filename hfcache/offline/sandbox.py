"""The process-tree network filter of ``hfcache exec --no-network``: a seccomp filter (libseccomp through ``pyseccomp``)
loaded in hfcache's process just before ``execvpe``, so every process of the command's tree inherits it. Its rules, why
each, what it does not cover: docs/offline.md, "exec --no-network". :func:`filter_problem` checks it is in force."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import socket
import stat
import time
from dataclasses import dataclass

from ..errors import OfflineViolation

#: The errno a refused ``socket``/``socketpair``/``socketcall`` returns (Python: ``PermissionError``).
SOCKET_ERRNO = errno.EACCES
#: The errno of the io_uring calls: "no io_uring here", so programs take their ordinary system-call path.
IO_URING_ERRNO = errno.ENOSYS
IO_URING_CALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register")
#: Calls that reach another process's sockets or make the kernel act outside the filter (``EPERM``), with the
#: number each has on every architecture but alpha, for a libseccomp too old to know its name (library gap).
FOREIGN_CALLS = (("pidfd_getfd", 438), ("process_vm_readv", None), ("process_vm_writev", None), ("ptrace", None),
                 ("request_key", None), ("bpf", None))
#: ``TUNSETIFF`` (linux/if_tun.h: ``_IOW('T', 202, int)``), the ioctl that creates or attaches a TUN/TAP device.
TUNSETIFF = 0x400454CA
#: ``TIOCSTI`` pushes input into the controlling terminal: the user's own shell (outside the filter) ran a line a
#: filtered child typed there (as bubblewrap refuses it: CVE-2017-5226); ``TIOCLINUX`` can do the same on a VT.
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
#: How long doctor's probe child may take before it is killed (it loads a filter and opens three sockets).
PROBE_TIMEOUT = 10.0


class NetworkFilterUnavailable(OfflineViolation):
    """``exec --no-network``: the filter could not be installed or is not in force; the command is not started
    (exit 4). ``reason`` (str): what failed, one line (``the kernel refused the network filter (EPERM: ...)``)."""

    def __init__(self, reason: str, *, hint: str | None = None) -> None:
        super().__init__(f"exec --no-network: {reason}; the command was not started",
                         hint=hint or "allow seccomp here (see `hfcache doctor`), or run without --no-network "
                                      "to rely on the Python guard only")
        self.reason = reason


def _load_binding():
    """``pyseccomp``, imported when a filter is wanted; NetworkFilterUnavailable without it or libseccomp."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:
        raise NetworkFilterUnavailable(f"libseccomp is not available ({exc})",
                                       hint="install libseccomp (Debian/Ubuntu: libseccomp2) and pyseccomp, or "
                                            "run without --no-network") from None
    return pyseccomp


def libseccomp_version() -> str | None:
    """The loaded libseccomp's version (``"2.5.4"``), or None; ``seccomp_version()`` is not wrapped by pyseccomp
    (library gap): called through the binding's handle."""
    try:
        binding = _load_binding()
    except NetworkFilterUnavailable:
        return None

    class _Version(ctypes.Structure):
        _fields_ = [("major", ctypes.c_uint), ("minor", ctypes.c_uint), ("micro", ctypes.c_uint)]

    try:
        function = binding._libseccomp.seccomp_version
    except AttributeError:
        return None
    function.argtypes = ()
    function.restype = ctypes.POINTER(_Version)
    version = function().contents
    return f"{version.major}.{version.minor}.{version.micro}"


def build_filter(binding=None):
    """The filter (docs/offline.md's rules), not loaded: a ``pyseccomp.SyscallFilter`` (default ALLOW,
    ``no_new_privs`` on) built with ``binding`` (default: ``pyseccomp`` imported now). Raises NetworkFilterUnavailable:
    libseccomp is missing, or refused a rule or attribute."""
    seccomp = binding or _load_binding()
    try:
        rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        rules.set_attr(seccomp.Attr.CTL_NNP, 1)
        _try_attr(rules, seccomp.Attr.API_SYSRAWRC, 1)  # the kernel's own errno from load() (libseccomp >= 2.5)
        _try_attr(rules, seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)  # else its default, KILL (the thread)
        refused = seccomp.ERRNO(SOCKET_ERRNO)
        for call in ("socket", "socketpair"):
            rules.add_rule(refused, call, seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
        rules.add_rule(refused, "socketcall")  # never matches on x86_64/aarch64 (no such call there)
        for call, number in FOREIGN_CALLS:
            known = seccomp.resolve_syscall(seccomp.Arch.NATIVE, call) >= 0
            if known or number is not None:
                rules.add_rule(seccomp.ERRNO(errno.EPERM), call if known else number)
        for request in (TUNSETIFF, TIOCSTI, TIOCLINUX):
            rules.add_rule(refused, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
        for number, call in enumerate(IO_URING_CALLS, start=425):
            # libseccomp < 2.5 has no names for them (library gap): 425-427 on every architecture but alpha
            known = seccomp.resolve_syscall(seccomp.Arch.NATIVE, call) >= 0
            rules.add_rule(seccomp.ERRNO(IO_URING_ERRNO), call if known else number)
    except (OSError, ValueError) as exc:
        raise NetworkFilterUnavailable(f"libseccomp refused to build the filter ({_describe(exc)})") from None
    return rules


def _try_attr(rules, attr: int, value: int) -> None:
    with contextlib.suppress(OSError):  # an older libseccomp keeps its default (raw errno, thread-kill: refinements)
        rules.set_attr(attr, value)


def _describe(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(code, int) and code in errno.errorcode:
        return f"{errno.errorcode[code]}: {os.strerror(code)}"
    return str(exc) or type(exc).__name__


def install_network_filter() -> None:
    """Load the filter into this process (irreversibly: only right before ``exec``) and check it is in force. Raises
    NetworkFilterUnavailable: libseccomp missing, the kernel has no seccomp or refused the load, or the filter is not in
    force after a load that reported success."""
    rules = build_filter()
    try:
        rules.load()
    except OSError as exc:
        raise NetworkFilterUnavailable(f"the kernel refused the network filter ({_describe(exc)})") from None
    if (problem := filter_problem()) is not None:
        raise NetworkFilterUnavailable(f"the network filter is not in force after loading it: {problem}")


def filter_problem() -> str | None:
    """Why this process is NOT under the filter, or None: ``/proc/self/status`` says ``Seccomp: 2`` and ``NoNewPrivs:
    1`` (when mounted), IP and netlink sockets get :data:`SOCKET_ERRNO`, ``io_uring_setup`` ``ENOSYS``, and an
    ``AF_UNIX`` pair is still created."""
    status = proc_status()
    if status is not None and (status.get("Seccomp") != "2" or status.get("NoNewPrivs") != "1"):
        return f"/proc/self/status has Seccomp: {status.get('Seccomp')}, NoNewPrivs: {status.get('NoNewPrivs')}"
    netlink = getattr(socket, "AF_NETLINK", None)
    probes = [(socket.AF_INET, socket.SOCK_STREAM, "AF_INET"), (socket.AF_INET, socket.SOCK_DGRAM, "AF_INET datagram"),
              (socket.AF_INET6, socket.SOCK_STREAM, "AF_INET6"),
              (socket.AF_INET6, socket.SOCK_DGRAM, "AF_INET6 datagram")]
    if netlink is not None:
        probes.append((netlink, socket.SOCK_RAW, "AF_NETLINK"))
    for family, kind, name in probes:
        if (code := _kernel_socket_errno(family, kind)) is None:
            return f"an {name} socket could still be created"
        if code != SOCKET_ERRNO and code != errno.EAFNOSUPPORT:
            return f"an {name} socket failed with {errno.errorcode.get(code, code)}, not the filter's EACCES"
    ring = _errno_of(_libc().syscall(ctypes.c_long(425), ctypes.c_uint(1), ctypes.c_void_p(0)))  # io_uring_setup
    if ring != IO_URING_ERRNO:
        return f"io_uring_setup answered {errno.errorcode.get(ring, ring) if ring else 'with a ring'}, not ENOSYS"
    try:
        left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        return f"an AF_UNIX socket pair failed ({_describe(exc)})"
    left.close()
    right.close()
    return None


def proc_status() -> dict[str, str] | None:
    """``/proc/self/status`` as ``{field: value}``; None when it cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            text = handle.read(65536)
    except OSError:
        return None
    fields = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in fields}


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _kernel_socket_errno(family: int, kind: int = socket.SOCK_STREAM) -> int | None:
    """The errno of ``socket(family, kind, 0)`` through libc (the Python guard would refuse first), or None."""
    return _errno_of(_libc().socket(family, kind, 0))


def _errno_of(fd: int) -> int | None:
    """The errno of a libc call that returned ``fd`` (None when it made one: closed at once)."""
    if fd >= 0:
        os.close(fd)
        return None
    return ctypes.get_errno()


#: Anonymous-inode descriptors (``/proc/self/fd`` names ``anon_inode:[KIND]``) a command may keep: they reach no
#: network. Every other one (``io_uring``: a ring the parent keeps polling runs the child's requests; ``pidfd``;
#: ``bpf-*``; ``perf_event``; ...) is closed at the exec.
_KEPT_ANON = ("eventfd", "eventpoll", "timerfd", "signalfd", "inotify", "fanotify", "memfd", "[memfd")
#: Character devices a command may keep: ttys, and the memory devices (major 1: null, zero, full, random, urandom).
_MEMORY_MAJOR = 1


def close_inherited_sockets() -> tuple[int, ...]:
    """Mark close-on-exec every inherited descriptor above stderr that could reach a network (the filter stops only new
    sockets): sockets but ``AF_UNIX``, io_uring rings, pidfds, character devices but ttys and memory devices, and
    anything unknown; stdin/stdout/stderr are kept whatever they are. Returns the descriptors marked. Raises
    NetworkFilterUnavailable: one could not be marked (fail closed)."""
    marked = []
    for fd in _open_descriptors():
        if fd <= 2:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:
            continue  # not open (the listing's own descriptor, or closed since)
        if _keeps(fd, mode):
            continue
        try:
            os.set_inheritable(fd, False)
        except OSError as exc:
            raise NetworkFilterUnavailable(f"cannot close inherited descriptor {fd} for the command "
                                           f"({_describe(exc)})") from None
        marked.append(fd)
    return tuple(marked)


def _keeps(fd: int, mode: int) -> bool:
    """Whether inherited descriptor ``fd`` (of file type ``mode``) reaches no network and may stay open."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISFIFO(mode):
        return True
    if stat.S_ISSOCK(mode):
        return _family(fd) == socket.AF_UNIX
    if stat.S_ISCHR(mode):
        return os.isatty(fd) or os.major(os.fstat(fd).st_rdev) == _MEMORY_MAJOR
    if stat.S_IFMT(mode) == 0:  # an anonymous inode: known by its name only
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        kind = name.removeprefix("anon_inode:").lstrip("[")
        return name.startswith("anon_inode:") and kind.startswith(_KEPT_ANON)
    return False


def _family(fd: int) -> int | None:
    """The family of socket ``fd`` (``SO_DOMAIN``), None when it cannot be read (treated as a network socket)."""
    try:
        probe = socket.socket(fileno=fd)
    except OSError:
        return None
    family = probe.family
    probe.detach()  # leaves the descriptor open
    return family


def _open_descriptors() -> list[int]:
    """The open descriptors: ``/proc/self/fd`` when it lists one opened just now (a tmpfs over ``/proc`` hid a socket),
    else every number up to the limit, and everything above marked close-on-exec (``close_range``)."""
    probe = os.open("/", os.O_RDONLY | os.O_CLOEXEC)
    try:
        listed = sorted(int(name) for name in os.listdir("/proc/self/fd") if name.isdigit())
        if probe in listed:
            return [fd for fd in listed if fd != probe]
    except OSError:
        pass
    finally:
        os.close(probe)
    import resource

    # Every number up to the hard limit (an inherited descriptor may sit above a lowered soft one), at most 2**20.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    first = min(max(n for n in (soft, hard, 1024) if n != resource.RLIM_INFINITY and n > 0), 1 << 20)
    # close_range(first, ~0U, CLOSE_RANGE_CLOEXEC); fails closed when unsupported
    if _libc().syscall(ctypes.c_long(436), ctypes.c_uint(first), ctypes.c_uint(0xFFFFFFFF), ctypes.c_uint(4)) != 0:
        raise NetworkFilterUnavailable(f"cannot mark inherited descriptors from {first} up close-on-exec without "
                                       f"/proc (close_range: {_describe(OSError(ctypes.get_errno(), ''))})")
    return list(range(3, first))


@dataclass(frozen=True)
class FilterProbe:
    """What :func:`probe_filter` found: ``available`` (the filter loads and is in force in a child), ``detail``
    (``seccomp, libseccomp 2.5.4``, or the reason), ``already_denied`` (this process cannot create IP sockets)."""

    available: bool
    detail: str
    already_denied: bool = False


def probe_filter(timeout: float = PROBE_TIMEOUT) -> FilterProbe:
    """Whether :func:`install_network_filter` works here, tried in a forked child (a filter cannot be removed) that
    reports one line over a pipe; killed after ``timeout`` seconds."""
    version = libseccomp_version()
    already = _kernel_socket_errno(socket.AF_INET) == SOCKET_ERRNO  # a filter already refuses IPv4 sockets
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child: never returns
        _probe_child(write_end)
    os.close(write_end)
    try:
        line = _read_line(read_end, timeout)
    finally:
        os.close(read_end)
        if os.waitpid(pid, os.WNOHANG)[0] == 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            os.waitpid(pid, 0)
    if line == "ok":
        return FilterProbe(True, f"seccomp, libseccomp {version}" if version else "seccomp", already)
    return FilterProbe(False, line or f"the probe gave no answer within {timeout:g} s", already)


def _probe_child(write_end: int) -> None:  # pragma: no cover - runs in the forked child
    try:
        install_network_filter()
        answer = "ok"
    except NetworkFilterUnavailable as exc:
        answer = exc.reason
    except BaseException as exc:  # the child must always exit below, never return into the parent's code
        answer = f"{type(exc).__name__}: {exc}"
    try:
        os.write(write_end, answer.replace("\n", " ").encode("utf-8", "replace")[:4000] + b"\n")
    finally:
        os._exit(0)


def _read_line(fd: int, timeout: float) -> str:
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return ""
        if not (chunk := os.read(fd, 4096)):
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace").strip()
