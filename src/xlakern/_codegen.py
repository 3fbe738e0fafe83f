"""Generation of the XLA FFI handlers that wrap user entry points.

For an entry point ``void scale(const xk::Tensor, xk::Tensor, float, int64_t)``
with spec ``arg ret attr.factor:float32 stream`` this emits ``xk_ffi_scale``, an
``XLA_FFI_Error* (XLA_FFI_CallFrame*)`` handler that checks the frame against the
signature (one input, one output, the attribute ``factor`` as a float32 scalar),
builds xk::Tensor views, calls ``scale`` and turns C++ exceptions into FFI errors.

The handlers read XLA's call frame through the FFI C API alone (``xlakern/ffi_frame.h``, the
"frame glue"), for C++ and CUDA modules alike. A module's handlers compile in about 1 s, where
handlers bound with XLA's templated ``Ffi::Bind()`` API cost a compiler about 3.4 s at -O3
(bench/RESULTS.md, session 70).
"""

from __future__ import annotations

from typing import Sequence

from ._spec import ATTR_TYPES, EntryPoint

GLUE_ABI_VERSION = 2  # 2: a second handler per entry point, with the xlakern_ctl attribute

# The attribute of the control handlers: [zero mask, unbatched rank of each buffer].
CONTROL_ATTR = "xlakern_ctl"

# What a control handler clears zeroed outputs with on the GPU: cudaMemsetAsync on XLA's stream.
_CUDA_CLEAR = ("[&](void* p, size_t bytes) {\n"
               "      const int rc = cudaMemsetAsync(p, 0, bytes, xk_stream);\n"
               "      if (rc != 0) throw ::xk::Error(\"zeroed_outputs: cudaMemsetAsync failed with CUDA error \" + "
               "std::to_string(rc));\n    }")


def _stream_arg(p) -> str:
    """The argument a ``stream`` parameter gets: XLA's stream, as cudaStream_t or as int64_t."""
    return "xk_stream" if "cudaStream_t" in p.cpp_type else "reinterpret_cast<int64_t>(xk_stream)"


def handler_symbol(entry_name: str) -> str:
    return f"xk_ffi_{entry_name}"


def control_handler_symbol(entry_name: str) -> str:
    """The handler ``mod.fn(...)`` calls: zeroed outputs and per-element vmap (see ffi_frame.h)."""
    return f"xk_ctl_{entry_name}"


_CONTROL_SUFFIX = ".xk"  # the control twin of target "mod.fn" is "mod.fn.xk"


def control_target(target: str) -> str:
    return target + _CONTROL_SUFFIX


def entry_target(target: str) -> str:
    """The target ``mod.fn`` a control twin stands for (``target`` itself if it is not one)."""
    return target[:-len(_CONTROL_SUFFIX)] if is_control_target(target) else target


def is_control_target(target: str) -> bool:
    """Whether ``target`` is the control twin ``mod.fn`` calls (not listed to users)."""
    return target.endswith(_CONTROL_SUFFIX)


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _handler(entry: EntryPoint, platform: str, allow_cuda_graph: bool, control: bool) -> str:
    """One handler of ``entry``: the plain one (the target's exact attribute interface, for raw
    ``jax.ffi.ffi_call``), or with ``control`` the one ``mod.fn(...)`` calls."""
    cpu = platform != "cuda"
    attrs = [p.attr_name for p in entry.params if p.kind == "attr"]
    names = sorted(attrs + ([CONTROL_ATTR] if control else []))  # XLA passes attributes sorted by name
    n_arg = sum(p.kind == "arg" for p in entry.params)
    n_ret = sum(p.kind == "ret" for p in entry.params)
    lines: list[str] = []
    if not cpu:
        lines.append("const cudaStream_t xk_stream = xk_f.stream();")
    for p in entry.params:
        if p.kind == "attr":
            cpp = ATTR_TYPES[p.attr_type]
            lines.append(f"const {cpp} attr_{p.attr_name} = xk_f.attr<{cpp}>({names.index(p.attr_name)});")
    call_args: list[str] = []
    i_arg = i_ret = 0
    for p in entry.params:
        if p.kind == "arg":
            call_args.append(f"xk_loop.tensor({i_arg}, xk_b)" if control else f"xk_f.input({i_arg})")
            i_arg += 1
        elif p.kind == "ret":
            call_args.append(f"xk_loop.tensor({n_arg + i_ret}, xk_b)" if control else f"xk_f.output({i_ret})")
            i_ret += 1
        elif p.kind == "attr":
            call_args.append(f"attr_{p.attr_name}")
        else:  # stream
            call_args.append(_stream_arg(p))
    call = f"{entry.qualified_name}({', '.join(call_args)});"
    if control:
        lines.append(f"const ::xk::frame::ElementLoop<{n_arg + n_ret}> xk_loop(xk_f, {n_arg}, "
                     f"{names.index(CONTROL_ATTR)});")
        lines.append(f"xk_loop.zero_outputs({'::xk::detail::parallel_zero' if cpu else _CUDA_CLEAR});")
        lines.append(f"for (int64_t xk_b = 0; xk_b < xk_loop.count(); ++xk_b) {call}")
        symbol = control_handler_symbol(entry.name)
    else:
        lines.append(call)
        symbol = handler_symbol(entry.name)
    names_array = f"xk_names_{symbol}"
    names_decl = (f"static const char* const {names_array}[] = {{{', '.join(_c_string(n) for n in names)}}};\n"
                  if names else "")
    traits = "XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE" if (not cpu and allow_cuda_graph) else "0"
    signature = ", ".join([_c_string(entry.name), str(n_arg), str(n_ret), names_array if names else "nullptr",
                           str(len(names)), traits])
    body = "\n    ".join(lines)
    return f"""
// {entry.name}{" (control handler)" if control else ""}: {entry.spec}
{names_decl}XK_EXPORT XLA_FFI_Error* {symbol}(XLA_FFI_CallFrame* xk_frame) {{
  static constexpr ::xk::frame::Signature xk_sig = {{{signature}}};
  return ::xk::frame::handle<{"true" if cpu else "false"}>(xk_frame, xk_sig, [&](const ::xk::frame::Frame& xk_f) {{
    {body}
  }});
}}
"""


# The unit that gives a C++ module its one definition of parallel_for's pooled half (xlakern/parallel_run.h;
# nvcc's units run parallel_for serially, so CUDA modules need none). Its text is the same for every module, so
# the object store compiles it once per compiler and flags; kept out of the handlers' unit, whose object is
# shared only by modules with the same entry points.
POOL_UNIT = ("// Generated by xlakern: parallel_for's thread-pool half, one definition per C++ module.\n"
             '#include "xlakern/parallel_run.h"\n')

# The unit that gives every module (C++ and CUDA) its one definition of the frame glue's error paths
# (xlakern/ffi_frame_errors.h), out of the handlers' unit for the same reason.
FRAME_ERRORS_UNIT = ("// Generated by xlakern: the frame glue's error paths, one definition per module.\n"
                     '#include "xlakern/ffi_frame_errors.h"\n')


def module_name_unit(module: str) -> str:
    """The one-line C++ unit that gives a library its module's name (``xk_module_name``, declared
    in ffi_frame.h), compiled at the library's link."""
    return (f"// Generated by xlakern: the name module '{module}' reports in its handlers' errors.\n"
            f'extern "C" __attribute__((visibility("hidden"))) const char xk_module_name[] = {_c_string(module)};\n')


def _declaration(entry: EntryPoint) -> str:
    linkage = 'extern "C" ' if entry.c_linkage else ""
    decl = f"{linkage}void {entry.name}({', '.join(p.cpp_type for p in entry.params)});"
    # Declared inside its namespaces, so the mangled name matches the user's definition.
    return "".join(f"namespace {n} {{ " for n in entry.namespace) + decl + " }" * len(entry.namespace)


def generate_glue(entries: Sequence[EntryPoint], platform: str, *, allow_cuda_graph: bool) -> str:
    """The C++ source of the handler translation unit of a module with these entry points. It names
    no module (see module_name_unit), so its object serves every module with these entry points."""
    decls = "\n".join(_declaration(e) for e in entries)
    handlers = "".join(_handler(e, platform, allow_cuda_graph, control) for e in entries for control in (False, True))
    # The CUDA runtime the module links (nvcc -cudart static), declared as cuda_runtime_api.h
    # does, so the host-compiled handlers need no CUDA headers.
    memset = 'extern "C" int cudaMemsetAsync(void*, int, size_t, cudaStream_t);\n' if platform == "cuda" else ""
    return f"""// Generated by xlakern ({platform}) for any module with these entry points. Do not edit.
#include <cstdint>
#include "xlakern/ffi_frame.h"

// The user's entry points (defined in their own translation units).
{decls}

{memset}
XK_EXPORT int xk_glue_abi_version() {{ return {GLUE_ABI_VERSION}; }}
{handlers}"""
