"""A small seccomp-BPF deny list for sandboxed code, handed to bwrap with `--seccomp FD` or loaded by the zygote.

Namespaces, dropped capabilities and no-new-privs already make these calls fail or stay inside the sandbox;
the filter is the extra layer that also refuses them outright (EPERM), e.g. `ptrace` of the sandbox's own init,
`io_uring` (a frequent kernel attack surface), keyrings and BPF, and `clone` with namespace flags: no nested
user namespaces (`clone3`, whose flags a filter cannot read, answers ENOSYS, so libc falls back to `clone`).
Non-native syscall ABIs (i386 `int 0x80`, x32) are refused entirely. Only x86_64 is described here; elsewhere
the service runs without this layer and /health says `seccomp: false`.
"""

from __future__ import annotations

import errno
import os
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl)
DENIED_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "swapon": 167, "swapoff": 168,
    "reboot": 169, "acct": 163, "unshare": 272, "setns": 308, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427,
}

CLONE, CLONE3 = 56, 435
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: a sandbox makes no namespaces of its own
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def supported() -> bool:
    return platform.machine() == "x86_64"


# What a fork source (a forkable session, see fork_src.py) may call beyond the others: the forked child makes its
# own namespaces (a nested user namespace first) and mounts, then stacks the full filter before any cell runs.
FORK_SOURCE_ALLOWED = ("unshare", "mount")


def build_filter(allow: tuple[str, ...] = ()) -> bytes:
    """The BPF program (struct sock_filter[]) that bwrap installs before exec'ing the sandboxed command; `allow`
    takes names off the deny list (a fork source's FORK_SOURCE_ALLOWED)."""
    if not supported():
        raise RuntimeError(f"no seccomp syscall table for {platform.machine()}")
    deny_eperm = _SECCOMP_RET_ERRNO | errno.EPERM
    deny_enosys = _SECCOMP_RET_ERRNO | errno.ENOSYS
    numbers = sorted(nr for name, nr in DENIED_X86_64.items() if name not in allow)
    prog = [
        _insn(_LD_W_ABS, 0, 0, 4),                       # A = seccomp_data.arch
        _insn(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),          # native ABI -> skip the next instruction
        _insn(_RET_K, 0, 0, deny_enosys),
        _insn(_LD_W_ABS, 0, 0, 0),                       # A = seccomp_data.nr
        _insn(_JGE_K, 0, 1, X32_SYSCALL_BIT),            # x32 ABI -> refuse
        _insn(_RET_K, 0, 0, deny_enosys),
        # clone3 passes its flags in memory a filter cannot read: ENOSYS, so libc falls back to clone
        _insn(_JEQ_K, 0, 1, CLONE3),
        _insn(_RET_K, 0, 0, deny_enosys),
        # clone with any CLONE_NEW* flag (a new user namespace above all): EPERM; plain fork/threads pass
        _insn(_JEQ_K, 0, 4, CLONE),
        _insn(_LD_W_ABS, 0, 0, 16),                      # A = low 32 bits of args[0] (the flags)
        _insn(_JSET_K, 0, 1, CLONE_NEW_FLAGS),
        _insn(_RET_K, 0, 0, deny_eperm),
        _insn(_RET_K, 0, 0, _SECCOMP_RET_ALLOW),
    ]
    for i, nr in enumerate(numbers):
        remaining = len(numbers) - i - 1
        prog.append(_insn(_JEQ_K, remaining + 1, 0, nr))  # match -> jump to the EPERM return at the end
    prog.append(_insn(_RET_K, 0, 0, _SECCOMP_RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, deny_eperm))
    return b"".join(prog)


def filter_fd() -> int:
    """A readable fd holding the filter (bwrap reads it once per sandbox; the caller closes it)."""
    data = build_filter()
    fd = os.memfd_create("agentrl-seccomp", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
