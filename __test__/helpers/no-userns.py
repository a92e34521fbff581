"""Run a command where no user namespace can be made, as in a container whose seccomp profile
refuses them (Docker's default profile does so without CAP_SYS_ADMIN): a seccomp filter, inherited
by every descendant, answers clone and unshare with CLONE_NEWUSER by EPERM, and clone3 (whose
flags a filter cannot read) by ENOSYS, so that the C library falls back to clone.

    python3 no-userns.py COMMAND [ARG...]

x86_64 and aarch64 only (exit code 3 elsewhere).
"""

import ctypes
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
CLONE_NEWUSER = 0x10000000
EPERM, ENOSYS = 1, 38
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
# (audit arch, seccomp syscall, clone, unshare, clone3)
ARCHES = {
    "x86_64": (0xC000003E, 317, 56, 272, 435),
    "aarch64": (0xC00000B7, 277, 220, 97, 435),
}
LD_W_ABS, JEQ_K, JSET_K, RET_K = 0x20, 0x15, 0x45, 0x06


def insn(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def program(arch, clone, unshare, clone3):
    return [
        insn(LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
        insn(JEQ_K, 1, 0, arch),
        insn(RET_K, 0, 0, RET_ALLOW),  # another ABI: left alone
        insn(LD_W_ABS, 0, 0, 0),  # seccomp_data.nr
        insn(JEQ_K, 0, 1, clone3),
        insn(RET_K, 0, 0, RET_ERRNO | ENOSYS),
        insn(JEQ_K, 2, 0, clone),
        insn(JEQ_K, 1, 0, unshare),
        insn(RET_K, 0, 0, RET_ALLOW),
        insn(LD_W_ABS, 0, 0, 16),  # args[0], low 32 bits (little-endian): the flags
        insn(JSET_K, 0, 1, CLONE_NEWUSER),
        insn(RET_K, 0, 0, RET_ERRNO | EPERM),
        insn(RET_K, 0, 0, RET_ALLOW),
    ]


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: no-userns.py COMMAND [ARG...]")
    spec = ARCHES.get(platform.machine())
    if spec is None:
        print(f"no-userns.py: no filter for {platform.machine()}", file=sys.stderr)
        sys.exit(3)
    arch, seccomp_nr, clone, unshare, clone3 = spec
    code = b"".join(program(arch, clone, unshare, clone3))
    buf = ctypes.create_string_buffer(code, len(code))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(f"no-userns.py: prctl: {os.strerror(ctypes.get_errno())}")
    if libc.syscall(ctypes.c_long(seccomp_nr), ctypes.c_long(SECCOMP_SET_MODE_FILTER), ctypes.c_long(0), ctypes.byref(prog)) != 0:
        sys.exit(f"no-userns.py: seccomp: {os.strerror(ctypes.get_errno())}")
    os.execvp(sys.argv[1], sys.argv[1:])


main()
