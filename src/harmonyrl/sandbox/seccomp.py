"""The fallback's guard against memory-backed files: a seccomp filter refusing ``memfd_create`` and SysV shm.

Without a cgroup nothing counts pages that belong to no process's address space: a ``memfd`` written with
``write()`` (never mapped, so RLIMIT_AS does not see it; RLIMIT_FSIZE caps one file, not how many) or a
SysV shared memory segment left behind after ``shmdt`` lives until its last reference goes. The filter
makes those calls fail with EPERM; every other syscall is allowed. Calls through a foreign ABI (i386 or x32
on x86-64) are refused outright, or the filter could be walked around with the other ABI's numbers.

The program is classic BPF (``struct sock_filter`` array) handed to bubblewrap's ``--seccomp FD``, built
here with :mod:`struct` so the sandbox stays standard library only. On an architecture not listed it is
None and the residual risk stays (it is documented in :mod:`harmonyrl.sandbox.bwrap`).
"""

from __future__ import annotations

import errno
import platform
import struct

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# audit arch, syscall numbers refused: memfd_create, memfd_secret, shmget
_ARCHES: dict[str, tuple[int, tuple[int, ...]]] = {
    "x86_64": (0xC000003E, (319, 447, 29)),
    "aarch64": (0xC00000B7, (279, 447, 194)),
}
BLOCKED = ("memfd_create", "memfd_secret", "shmget")


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def memfd_guard(machine: str | None = None) -> bytes | None:
    """The filter program for this machine's architecture (``platform.machine()``), or None if unknown."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, numbers = arch
    deny = _ERRNO | errno.EPERM
    n = len(numbers)
    prog = [
        _insn(_LD_W_ABS, 4),  # seccomp_data.arch
        _insn(_JEQ, audit_arch, jt=1),  # native: skip the next (deny)
        _insn(_RET, deny),
        _insn(_LD_W_ABS, 0),  # seccomp_data.nr
        _insn(_JGE, _X32_BIT, jt=n + 1),  # x32 numbers: to the final deny
    ]
    for i, number in enumerate(numbers):
        prog.append(_insn(_JEQ, number, jt=n - i))  # jump over the remaining tests and the allow
    prog += [_insn(_RET, _ALLOW), _insn(_RET, deny)]
    return b"".join(prog)
