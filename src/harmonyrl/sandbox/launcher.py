"""The first program inside every sandbox: join the cgroup, cap ``/tmp``, set limits, drop privileges, exec.

It runs as ``python -I -S -c LAUNCHER CONFIG`` with the chosen interpreter (so, no imports beyond the standard
library), before any of the model's code; :mod:`harmonyrl.sandbox.bwrap` builds its JSON config.
"""

from __future__ import annotations

LAUNCHER = """
import json, os, resource, sys
c = json.loads(sys.argv[1])
for fd in c["cgroup_fds"]:
    os.write(fd, b"0")
    os.close(fd)
if c["tmp"]:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    def check(failed, what):
        if failed:
            raise OSError(ctypes.get_errno(), what)
    code = open("/tmp/main.py", "rb").read()
    check(libc.unshare(0x20000), "unshare(CLONE_NEWNS)")  # CLONE_NEWNS
    keep = [(os.open(path, os.O_PATH), path) for path in c["tmp_binds"]]
    # MS_NOSUID | MS_NODEV
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", 2 | 4, c["tmp"].encode()), "mounting /tmp with " + c["tmp"])
    fd = os.open("/tmp/main.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
    os.write(fd, code)
    os.close(fd)
    for fd, path in keep:
        os.makedirs(path, 0o755, exist_ok=True)
        # MS_BIND | MS_REC; the source is a read-only bind, and a bind keeps it read-only
        check(libc.mount(b"/proc/self/fd/%d" % fd, path.encode(), None, 0x1000 | 0x4000, None), "binding " + path)
        os.close(fd)
for name, pair in c["rlimits"].items():
    resource.setrlimit(getattr(resource, name), tuple(pair))
if c["uid"] is not None:
    os.setgroups([])
    os.setresgid(c["uid"], c["uid"], c["uid"])
    os.setresuid(c["uid"], c["uid"], c["uid"])
if c["tmp"]:
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    check(libc.capset(header, (ctypes.c_uint32 * 6)()), "dropping capabilities")  # all three sets empty
os.write(c["status_fd"], b"1")
os.close(c["status_fd"])
os.execv(c["argv"][0], c["argv"])
"""
"""Runs first inside the sandbox (``python -I -S -c``); tiny, because everything before the exec is ours.

In order: join the sandbox's cgroup (``0`` to each inherited ``cgroup.procs``); replace ``/tmp`` by a tmpfs
with an inode cap (bubblewrap's ``--tmpfs`` takes a size but no ``nr_inodes``) in a mount namespace of its
own (without root, bubblewrap's tmpfs belongs to an outer user namespace and cannot be remounted: EPERM,
measured), carrying the code and the read-only binds of an interpreter under ``/tmp`` across (``O_PATH``
descriptors opened in the new namespace before the mount hides them; a bind needs its source in the
caller's namespace, EINVAL otherwise); set the rlimits; drop to the run's uid (root mode); drop every
capability that allowed the mount (ambient, then ``capset`` to nothing, so the code's exec gets none);
report "started", exec."""
