"""The worker's switches that could turn the dispatch guard off, out of the learner's reach.

The guard of :mod:`.allowed_ops` is a pair of modes on PyTorch's thread-local mode stacks.
Python can pop them (``torch._C._pop_torch_dispatch_stack``), read them to change them
(``_get_dispatch_stack_at``), step below them (``_DisableTorchDispatch``, a dispatch key
excluded, an op redispatched below the Python key, torch-function state disabled), run
code where the dispatch mode is popped (a ``torch.library`` kernel, which runs inside the
guard's own handler), or run code on a thread of its own, whose stacks are empty.
:func:`seal` runs in the worker after the guard's factory has taken its own references and
before any learner code is imported: every such function, wherever a loaded module holds
it, is replaced by one that records the attempt and raises, so that the probe's reply is
``forbidden`` whatever the code did with the exception. :func:`forbid_new_tasks` then
makes the kernel refuse every new thread and process of the worker (a seccomp filter), so
no code runs outside the guard's thread.

What this holds is stated on the instructor page (``book/instructor.md``, "What it cannot
stop"): a switch reached through any Python name, private ones included, is refused; code
that writes the process's memory by a road other than ``ctypes`` (refused by the worker's
audit hook, :mod:`.process`) is not stopped by anything inside the process.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys
from pathlib import Path
from typing import Any

# torch._C's functions and context managers that pop, read, replace or step below the modes.
# The torch-function stack's push and pop stay: PyTorch's own ``handle_torch_function`` pops a
# mode while it runs; the guard checks instead that its mode is in place whenever an op runs.
SWITCHES = (
    "_pop_torch_dispatch_stack", "_push_on_torch_dispatch_stack", "_get_dispatch_stack_at",
    "_set_dispatch_mode", "_unset_dispatch_mode", "_get_dispatch_mode",
    "_get_function_stack_at",
    "_set_torch_function_state", "_set_skip_next_torch_function",
    "_skip_one_hop_torch_function", "DisableTorchFunction",
    "_DisableTorchDispatch", "_DisablePythonDispatcher", "_EnablePythonDispatcher",
    "ExcludeDispatchKeyGuard", "_ExcludeDispatchKeyGuard", "_IncludeDispatchKeyGuard",
    "_ForceDispatchKeyGuard", "_SetExcludeDispatchKeyGuard", "_RestorePythonTLSSnapshot",
    "_dispatch_tls_set_dispatch_key_excluded", "_dispatch_tls_set_dispatch_key_included",
    "_dispatch_call_boxed",
)
# Methods of torch._C's classes that call an op below the Python dispatch key.
METHODS = (("_DispatchOperatorHandle", "redispatch_boxed"),)
# torch.library's registrations: a kernel of the learner's for an aten op (or a fallback)
# would run inside the guard's own dispatch handler, where its mode is popped
# (grading.worker.allowed_ops). A library is made, or a kernel, fallback or op registered on one
# (on a library PyTorch made before, too), only by a module of PyTorch's being imported
# (the meta device imports PyTorch's compiler, which registers its own).
LIBRARY = ("_dispatch_library",)
LIBRARY_METHODS = tuple(("_DispatchModule", name) for name in (
    "impl", "impl_t_t", "impl_with_aoti_compile", "fallback", "fallback_fallthrough", "def_",
    "def_legacy", "def_name_t_t", "def_schema_t_t", "define",
    "register_ad_inplace_or_view_fallback"))


class SwitchRefused(RuntimeError):
    """Learner code reached a function that would turn the grader's guard off."""


def seal(attempts: list[str]) -> None:
    """Replace every switch, in ``torch._C`` and wherever a loaded module holds it, by a
    function that appends its name to ``attempts`` and raises :class:`SwitchRefused`
    (``torch.library``'s registrations: unless a module of PyTorch's is being imported).
    Idempotent; the guard keeps the originals it took before."""
    import torch

    replaced: dict[int, Any] = {}  # id of an original -> what stands in its place
    for name in (*SWITCHES, *LIBRARY):
        value = getattr(torch._C, name, None)
        if value is not None and not getattr(value, "sealed", False):
            replaced[id(value)] = _refuser(f"torch._C.{name}", attempts,
                                           value if name in LIBRARY else None)
            setattr(torch._C, name, replaced[id(value)])
    for owner, name in (*METHODS, *LIBRARY_METHODS):
        cls = getattr(torch._C, owner, None)
        value = getattr(cls, name, None)
        if value is not None and not getattr(value, "sealed", False):
            setattr(cls, name, _refuser(f"torch._C.{owner}.{name}", attempts, value if (
                owner, name) in LIBRARY_METHODS else None))
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for key, value in list(namespace.items()):
            if id(value) in replaced:
                namespace[key] = replaced[id(value)]


def _refuser(name: str, attempts: list[str], original: Any = None):
    """What stands in place of switch ``name``: records the call and raises, unless
    ``original`` is given and PyTorch is importing one of its own modules (then it calls
    ``original``)."""
    def refused(*args: Any, **kwargs: Any) -> Any:
        if original is not None and _pytorch_importing(sys._getframe(1)):
            return original(*args, **kwargs)
        attempts.append(name)
        raise SwitchRefused(f"{name} turns the grader's check of PyTorch's ops off; an "
                            f"answer to an exercise never needs it")
    refused.__name__ = refused.__qualname__ = name.rpartition(".")[2]
    refused.sealed = True  # type: ignore[attr-defined]
    return refused


def _pytorch_importing(frame: Any) -> bool:
    """Whether ``frame``'s call comes from a module of PyTorch's being imported: outward
    from ``frame``, PyTorch's own frames, the outermost of them a module's body, run by
    Python's import system (its ``_call_with_frames_removed``: the code object itself, which
    no other code is)."""
    import importlib._bootstrap

    import torch

    imports = importlib._bootstrap._call_with_frames_removed.__code__
    package = str(Path(torch.__file__).parent) + os.sep
    inner = None
    while frame is not None and frame.f_code.co_filename.startswith(package):
        inner, frame = frame, frame.f_back
    return (inner is not None and inner.f_code.co_name == "<module>" and frame is not None
            and frame.f_code is imports)


# ---------------------------------------------------------------- no new thread or process

# Linux's seccomp filter: struct sock_filter {u16 code; u8 jt, jf; u32 k}.
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS = 1, 38
# arch (AUDIT_ARCH_*), then the numbers of clone, fork, vfork (None where absent) and clone3.
_ARCHES = {"x86_64": (0xC000003E, 56, 57, 58, 435), "aarch64": (0xC00000B7, 220, None, None, 435)}


def filter_program(machine: str) -> bytes | None:
    """The BPF program that refuses ``clone``, ``fork`` and ``vfork`` (EPERM) and
    ``clone3`` (ENOSYS, so that a C library falls back to ``clone``) on ``machine``, and
    every call of another numbering (x32, a 32-bit ABI); None for an unknown machine."""
    if machine not in _ARCHES:
        return None
    arch, clone, fork, vfork, clone3 = _ARCHES[machine]
    # (code, jump if true, jump if false, k), the jumps as labels of the last three lines
    lines: list[tuple[int, str | None, str | None, int]] = [
        (_LD_ABS, None, None, 4), (_JEQ, None, "eperm", arch),  # seccomp_data.arch
        (_LD_ABS, None, None, 0),  # seccomp_data.nr
    ]
    if machine == "x86_64":
        lines.append((_JGE, "eperm", None, 0x40000000))  # the x32 numbering
    lines.append((_JEQ, "enosys", None, clone3))
    lines += [(_JEQ, "eperm", None, n) for n in (clone, fork, vfork) if n is not None]
    lines += [(_RET, None, None, _ALLOW), (_RET, None, None, _ERRNO | _EPERM),
              (_RET, None, None, _ERRNO | _ENOSYS)]
    at = {"eperm": len(lines) - 2, "enosys": len(lines) - 1}
    program = b""
    for index, (code, true, false, k) in enumerate(lines):
        jt = at[true] - index - 1 if true else 0
        jf = at[false] - index - 1 if false else 0
        program += struct.pack("=HBBI", code, jt, jf, k)
    return program


def forbid_new_tasks() -> str | None:
    """From now on, the kernel refuses this process every new thread and process. None
    when done, else why not (an unknown machine, a kernel without seccomp)."""
    program = filter_program(platform.machine())
    if program is None:
        return f"no seccomp filter for a {platform.machine()} machine"
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = Program(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        return f"prctl(PR_SET_NO_NEW_PRIVS) failed: errno {ctypes.get_errno()}"
    if libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.byref(fprog), 0, 0) != 0:
        return f"prctl(PR_SET_SECCOMP) failed: errno {ctypes.get_errno()}"
    return None
