"""The system calls a job's frame may not make, as a seccomp filter bubblewrap loads just before
the command (``--seccomp FD``), built with libseccomp (``libseccomp.so.2``, the library behind
every container runtime's profile).

Why, when the job is no root and holds no capability: two doors stay open to any user.

* **A user namespace of its own.** Inside one, an unprivileged user is root of new mount
  namespaces: a job made ``unshare -Urm`` and mounted a tmpfs with no size — half the host's
  memory, past every size the frame set (and an mqueue). So ``unshare`` and ``clone`` asking for
  ``CLONE_NEWUSER`` are refused (EPERM), and ``clone3`` — whose flags live in a structure no
  filter can read — answers ENOSYS, on which glibc falls back to ``clone``, as under Docker's
  default profile.
* **The kernel keyring**, which no namespace separates: jobs run as one user shared a keyring —
  one job's ``add_key`` was another's to read — and any job could exhaust its quota. ``add_key``,
  ``keyctl`` and ``request_key`` are refused, as Docker's default profile refuses them.

Anything else is allowed: the filter closes these doors and leaves the rest to the frame's user,
namespaces and capabilities. A system call of another ABI than this host's (an i386 or x32
program on x86-64) is one libseccomp's filter kills: nothing it did could be checked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os

from ..errors import UsageError

SECCOMP_INSTALL = "install it: apt-get install libseccomp2 (Debian, Ubuntu), dnf install libseccomp (Fedora, RHEL)"
_CLONE_NEWUSER = 0x10000000
_ACT_ALLOW = 0x7FFF0000
_MASKED_EQ = 7  # SCMP_CMP_MASKED_EQ: (argument & mask) == value
#: (system call, errno, (argument, flag) refused when set — or None: refused whatever it asks).
RULES: tuple[tuple[str, int, tuple[int, int] | None], ...] = (
    ("unshare", errno.EPERM, (0, _CLONE_NEWUSER)),
    ("clone", errno.EPERM, (0, _CLONE_NEWUSER)),  # the flags are the first argument on x86-64 and arm64
    ("clone3", errno.ENOSYS, None),
    ("add_key", errno.EPERM, None),
    ("keyctl", errno.EPERM, None),
    ("request_key", errno.EPERM, None),
)


class _Comparison(ctypes.Structure):
    """``struct scmp_arg_cmp``."""

    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


@functools.cache  # find_library runs `ldconfig -p`: once per process, not once per frame
def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        raise UsageError(f"libseccomp is not installed here, and a bubblewrap frame needs it to keep a job from "
                         f"making user namespaces or using the kernel keyring: {SECCOMP_INSTALL}") from None
    lib.seccomp_init.argtypes, lib.seccomp_init.restype = [ctypes.c_uint32], ctypes.c_void_p
    lib.seccomp_release.argtypes, lib.seccomp_release.restype = [ctypes.c_void_p], None
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_Comparison)]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_export_bpf.argtypes, lib.seccomp_export_bpf.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    return lib


def filter_fd() -> int:
    """A descriptor holding the filter's BPF program (:data:`RULES`), at its start, for
    bubblewrap's ``--seccomp``; the caller closes it."""
    lib = _library()
    context = lib.seccomp_init(_ACT_ALLOW)
    if not context:
        raise OSError(errno.ENOMEM, "libseccomp could not make a filter")
    try:
        for name, code, flag in RULES:
            number = lib.seccomp_syscall_resolve_name(name.encode())
            if number < 0:  # not a system call of this architecture
                continue
            action = 0x00050000 | code  # SCMP_ACT_ERRNO(code)
            if flag is None:
                done = lib.seccomp_rule_add_array(context, action, number, 0, None)
            else:
                argument, mask = flag
                done = lib.seccomp_rule_add_array(context, action, number, 1,
                                                  ctypes.byref(_Comparison(argument, _MASKED_EQ, mask, mask)))
            if done < 0:
                raise OSError(-done, f"libseccomp refused the rule for {name}")
        fd = os.memfd_create("tao-data-io-seccomp", os.MFD_CLOEXEC)
        try:
            done = lib.seccomp_export_bpf(context, fd)
            if done < 0:
                raise OSError(-done, "libseccomp could not write the filter")
            os.lseek(fd, 0, os.SEEK_SET)
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        lib.seccomp_release(context)
