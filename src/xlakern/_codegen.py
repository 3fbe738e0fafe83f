"""Generation of the XLA FFI handlers that wrap user entry points.

For an entry point ``void scale(const xk::Tensor, xk::Tensor, float, int64_t)``
with spec ``arg ret attr.factor:float32 stream`` this emits ``xk_ffi_scale``, an
``XLA_FFI_Error* (XLA_FFI_CallFrame*)`` handler that checks the frame against the
signature (one input, one output, the attribute ``factor`` as a float32 scalar),
builds xk::Tensor views, calls ``scale`` and turns C++ exceptions into FFI errors.

Two emitters exist while the CUDA one is moved over:

* the frame glue (``xlakern/ffi_frame.h``, XLA's C API alone), for the platforms in
  :data:`FRAME_GLUE_PLATFORMS`. Its handler compiles in a fraction of a second;
* the typed glue (``xlakern/ffi_glue.h``, XLA's templated ``Ffi::Bind()`` API), for the
  others. Its handlers cost a compiler about 3 s a module at -O3.
"""

from __future__ import annotations

from typing import Sequence

from ._spec import ATTR_TYPES, EntryPoint

GLUE_ABI_VERSION = 2  # 2: a second handler per entry point, with the xlakern_ctl attribute

# The attribute of the control handlers: [zero mask, unbatched rank of each buffer].
CONTROL_ATTR = "xlakern_ctl"

# Platforms whose modules get the frame glue. CUDA keeps the typed glue until a GPU run of the
# whole suite has passed on the frame glue: its handler is host-compiled beside nvcc, so a cold
# CUDA build does not wait on it the way a cold C++ build does.
FRAME_GLUE_PLATFORMS = frozenset({"cpu"})


def uses_frame_glue(platform: str) -> bool:
    """Whether a module of ``platform`` gets the frame glue (and so a module-name unit at its link)."""
    return platform in FRAME_GLUE_PLATFORMS


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
    """The handler ``mod.fn(...)`` calls: zeroed outputs and per-element vmap (see ffi_glue.h)."""
    return f"xk_ctl_{entry_name}"


def control_target(target: str) -> str:
    return f"{target}.xk"


def is_control_target(target: str) -> bool:
    """Whether ``target`` is the control twin ``mod.fn`` calls (not listed to users)."""
    return target.endswith(".xk")


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _handler(module: str, entry: EntryPoint, platform: str, allow_cuda_graph: bool, control: bool) -> str:
    """One handler of ``entry``: the plain one (the target's exact attribute interface, for raw
    ``jax.ffi.ffi_call``), or with ``control`` the one ``mod.fn(...)`` calls."""
    impl_params: list[str] = []
    call_args: list[str] = []
    binding: list[str] = []
    if platform == "cuda":
        binding.append(".Ctx<ffi::PlatformStream<cudaStream_t>>()")
        impl_params.append("cudaStream_t xk_stream")
    else:
        binding.append(".Ctx<ffi::ThreadPool>()")
        impl_params.append("ffi::ThreadPool xk_pool")
    buffers: list[str] = []
    n_arg = n_ret = 0
    for p in entry.params:
        if p.kind == "arg":
            binding.append(".Arg<ffi::AnyBuffer>()")
            impl_params.append(f"ffi::AnyBuffer a{n_arg}")
            view = f'::xk::detail::to_tensor(a{n_arg}, "input", {n_arg})'
            buffers.append(f"&a{n_arg}")
            n_arg += 1
        elif p.kind == "ret":
            binding.append(".Ret<ffi::AnyBuffer>()")
            impl_params.append(f"ffi::Result<ffi::AnyBuffer> r{n_ret}")
            view = f'::xk::detail::to_tensor(*r{n_ret}, "output", {n_ret})'
            buffers.append(f"&*r{n_ret}")
            n_ret += 1
        elif p.kind == "attr":
            cpp = ATTR_TYPES[p.attr_type]
            binding.append(f'.Attr<{cpp}>({_c_string(p.attr_name)})')
            impl_params.append(f"{cpp} attr_{p.attr_name}")
            call_args.append(f"attr_{p.attr_name}")
            continue
        else:  # stream
            call_args.append(_stream_arg(p))
            continue
        call_args.append(f"xk_loop.tensor({len(buffers) - 1}, xk_b)" if control else view)
    target = f"{module}.{entry.name}"
    call = f"{entry.qualified_name}({', '.join(call_args)});"
    if control:
        binding.append(f'.Attr<ffi::Span<const int64_t>>("{CONTROL_ATTR}")')
        impl_params.append("ffi::Span<const int64_t> xk_ctl")
        setter = _CUDA_CLEAR if platform == "cuda" else "::xk::detail::parallel_zero"
        clear = f"xk_loop.zero_outputs({n_arg}, {setter});"
        body = (f"const std::array<const ffi::AnyBuffer*, {len(buffers)}> xk_bufs = {{{{{', '.join(buffers)}}}}};\n"
                f"    const ::xk::detail::ElementLoop<{len(buffers)}> xk_loop(xk_ctl, xk_bufs, {n_arg});\n"
                f"    {clear}\n"
                f"    for (int64_t xk_b = 0; xk_b < xk_loop.count(); ++xk_b) {call}")
        symbol, impl = control_handler_symbol(entry.name), f"xk_ctl_impl_{entry.name}"
    else:
        body = call
        symbol, impl = handler_symbol(entry.name), f"xk_impl_{entry.name}"
    if platform != "cuda":
        body = ("::xk::detail::FfiThreadPool pool(xk_pool);\n"
                "    ::xk::detail::ThreadPoolScope scope(pool.ref());\n"
                f"    {body}")
    traits = ", {ffi::Traits::kCmdBufferCompatible}" if (platform == "cuda" and allow_cuda_graph) else ""
    sep = "\n        "
    return f"""
// {control_target(target) if control else target}: {entry.spec}   ({entry.source}, line {entry.line})
static ffi::Error {impl}({', '.join(impl_params)}) {{
  return ::xk::detail::guarded_call({_c_string(target)}, [&] {{
    {body}
  }});
}}
XLA_FFI_DEFINE_HANDLER_SYMBOL({symbol}, {impl},
    ffi::Ffi::Bind(){sep}{sep.join(binding)}{traits});
"""


def _frame_handler(entry: EntryPoint, platform: str, allow_cuda_graph: bool, control: bool) -> str:
    """One handler of ``entry`` on the frame glue; see :func:`_handler` for the two kinds."""
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


def module_name_unit(module: str) -> str:
    """The one-line C++ unit that gives a library on the frame glue its module's name
    (``xk_module_name``, declared in ffi_frame.h), compiled at the library's link."""
    return (f"// Generated by xlakern: the name module '{module}' reports in its handlers' errors.\n"
            f'extern "C" __attribute__((visibility("hidden"))) const char xk_module_name[] = {_c_string(module)};\n')


def _declaration(entry: EntryPoint) -> str:
    linkage = 'extern "C" ' if entry.c_linkage else ""
    decl = f"{linkage}void {entry.name}({', '.join(p.cpp_type for p in entry.params)});"
    # Declared inside its namespaces, so the mangled name matches the user's definition.
    return "".join(f"namespace {n} {{ " for n in entry.namespace) + decl + " }" * len(entry.namespace)


def generate_glue(module: str, entries: Sequence[EntryPoint], platform: str, *, allow_cuda_graph: bool) -> str:
    """The C++ source of the handler translation unit of one module."""
    decls = "\n".join(_declaration(e) for e in entries)
    frame = uses_frame_glue(platform)
    include = ('#include "xlakern/ffi_frame.h"' if frame
               else '#include "xlakern/ffi_glue.h"\n\nnamespace ffi = ::xla::ffi;')
    handlers = "".join(_frame_handler(e, platform, allow_cuda_graph, control) if frame
                       else _handler(module, e, platform, allow_cuda_graph, control)
                       for e in entries for control in (False, True))
    # The CUDA runtime the module links (nvcc -cudart static), declared as cuda_runtime_api.h
    # does, so the host-compiled handlers need no CUDA headers.
    memset = 'extern "C" int cudaMemsetAsync(void*, int, size_t, cudaStream_t);\n' if platform == "cuda" else ""
    # The frame glue names no module (see module_name_unit): its object serves every module with
    # these entry points.
    made_for = f"({platform}) for any module with these entry points" if frame else f"for module '{module}' ({platform})"
    return f"""// Generated by xlakern {made_for}. Do not edit.
#include <cstdint>
{include}

// The user's entry points (defined in their own translation units).
{decls}

{memset}
XK_EXPORT int xk_glue_abi_version() {{ return {GLUE_ABI_VERSION}; }}
{handlers}"""
