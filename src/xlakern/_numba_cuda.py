"""Numba CUDA kernels as JAX operations, launched from C++: ``numba_cuda_kernel``.

``numba_cuda_kernel`` specialises the ``@cuda.jit`` dispatcher for the call's array types at
trace time, takes the linked cubin for the GPU's compute capability and the kernel's entry
name, and registers them with the runtime. The runtime's ``xlakern.cuda_image`` handler loads
the image once per device context and launches it with ``cuLaunchKernel`` on XLA's stream,
packing each array in Numba's argument layout: no Python per launch, and XLA may capture the
launches into a CUDA graph.

``numba_cuda_callable``, which runs a Python function per call, is its own bridge
(``xlakern._python_callable``); its names stay importable from here.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from . import _bridge, _compat, _numba_store, _runtime, _toolchain
from ._bridge_op import BridgeOp, RegisteredKernels
from ._build import Progress
from ._fingerprint import Fingerprint
from ._hoist import without_body_imports
from .errors import CallError, SpecError

from ._dtypes import NUMBA_DTYPES as NUMBA_CUDA_DTYPES  # from the one dtype table
DEFAULT_BLOCK_2D = (16, 16, 1)
DEFAULT_BLOCK_3D = (8, 8, 4)
_MAX_THREADS_PER_BLOCK = 1024
_IMAGE_VERSION = 1  # bump when what a stored or registered kernel image holds changes


def import_numba_cuda() -> Any:
    """``numba.cuda``, imported with the NumPy 2.5 workaround in place (``_compat``, imported
    above, restores np.row_stack before numba.cuda registers overloads)."""
    try:
        from numba import cuda
    except ImportError as e:
        raise CallError(f"Numba CUDA kernels need numba-cuda (pip install numba-cuda): {e}") from e
    return cuda


# --------------------------------------------------------------------------- launch configuration

def _dims(value: Any, what: str, *, allow_zero: bool) -> tuple[int, int, int]:
    items = (value,) if isinstance(value, (int, np.integer)) else value
    if not isinstance(items, (tuple, list)) or not 1 <= len(items) <= 3 or not all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in items):
        raise SpecError(f"{what} must be an int or a tuple of 1 to 3 ints; got {value!r}")
    low = 0 if allow_zero else 1
    if any(int(v) < low for v in items):
        raise SpecError(f"{what} must be {'non-negative' if allow_zero else 'positive'}; got {value!r}")
    dims = [int(v) for v in items] + [1] * (3 - len(items))
    return dims[0], dims[1], dims[2]


def numba_cuda_launch_config(launch_dims: Any, threads_per_block: int = 256
                             ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``(grid, block)`` as 3-tuples for ``launch_dims`` total threads per dimension.

    1-D: ``threads_per_block`` threads per block; 2-D: 16×16 blocks; 3-D: 8×8×4 blocks. The
    grid covers every dimension (ceil division), so kernels must bounds-check. A zero dimension
    (an empty problem) gives an empty grid: such a call launches nothing and zero-fills its outputs.

    Example::

        >>> xlakern.numba_cuda_launch_config(1000)
        ((4, 1, 1), (256, 1, 1))
        >>> xlakern.numba_cuda_launch_config((64, 100))
        ((4, 7, 1), (16, 16, 1))
    """
    n_dims = 1 if isinstance(launch_dims, (int, np.integer)) else len(launch_dims) if isinstance(
        launch_dims, (tuple, list)) else 0
    dims = _dims(launch_dims, "launch_dims", allow_zero=True)
    if not isinstance(threads_per_block, (int, np.integer)) or not 1 <= threads_per_block <= _MAX_THREADS_PER_BLOCK:
        raise SpecError(f"threads_per_block must be an int in 1..{_MAX_THREADS_PER_BLOCK}; got {threads_per_block!r}")
    block = {1: (int(threads_per_block), 1, 1), 2: DEFAULT_BLOCK_2D, 3: DEFAULT_BLOCK_3D}[n_dims]
    grid = tuple(math.ceil(d / b) for d, b in zip(dims, block))
    return grid, block  # type: ignore[return-value]


def _launch(grid: Any, block: Any, launch_dims: Any, threads_per_block: int, shared_mem: Any
            ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    if launch_dims is not None:
        if grid is not None or block is not None:
            raise SpecError("numba_cuda_kernel: give either grid= and block=, or launch_dims=, not both")
        g, b = numba_cuda_launch_config(launch_dims, threads_per_block)
    else:
        if grid is None and block is None:
            raise SpecError("numba_cuda_kernel needs a launch configuration: grid= and block= "
                            "(blocks and threads per block), or launch_dims= (total threads)")
        if grid is None or block is None:
            raise SpecError(f"numba_cuda_kernel: grid= and block= go together; got only "
                            f"{'grid' if block is None else 'block'}=")
        g = _dims(grid, "grid", allow_zero=False)
        b = _dims(block, "block", allow_zero=False)
    if b[0] * b[1] * b[2] > _MAX_THREADS_PER_BLOCK:
        raise SpecError(f"numba_cuda_kernel: block {b} has {b[0] * b[1] * b[2]} threads; a CUDA block holds "
                        f"at most {_MAX_THREADS_PER_BLOCK}")
    if not isinstance(shared_mem, (int, np.integer)) or isinstance(shared_mem, bool) or shared_mem < 0:
        raise SpecError(f"numba_cuda_kernel: shared_mem must be a non-negative number of bytes; got {shared_mem!r}")
    return g, b, int(shared_mem)


# --------------------------------------------------------------------------- kernel images

@dataclass(frozen=True)
class KernelImage:
    kind: str  # "cubin" or "ptx"
    data: bytes  # cubin bytes, or NUL-terminated PTX text
    entry: str  # the kernel's mangled name: its PTX ".entry"


def _array_types(dtypes: Sequence[str], ranks: Sequence[int]) -> tuple:
    import numba

    return tuple(numba.types.Array(numba.from_dtype(np.dtype(d)), int(r), "C") for d, r in zip(dtypes, ranks))


def _reject_unsupported(kern: Any, name: str) -> None:
    """Refuse kernels whose launch needs Numba's own launcher."""
    reasons = []
    if getattr(kern, "debug", False):
        reasons.append("it was compiled with debug=True, whose exception flag Numba's launcher checks after "
                       "every launch; compile without debug=True")
    if getattr(kern, "cooperative", False):
        reasons.append("it synchronises the grid (cooperative launch)")
    if getattr(kern, "extensions", None):
        reasons.append("it was compiled with launch extensions")
    if getattr(kern, "launch_config_sensitive", False):
        reasons.append("it is launch-configuration sensitive")
    reasons += _compat.launch_needs_numba(_compat.cuda_code_library(kern))
    if reasons:
        raise CallError(f"numba_cuda_kernel: '{name}' cannot be launched from xlakern's runtime: "
                        f"{'; '.join(reasons)}. Use numba_cuda_callable, which launches through Numba")


def kernel_image(dispatcher: Any, arg_types: Sequence[Any], cc: tuple[int, int] | None = None,
                 prefer: str = "cubin") -> KernelImage:
    """The compiled image and entry name of ``dispatcher`` for ``arg_types``.

    ``prefer="cubin"`` specialises the dispatcher (needs a GPU) and returns the linked cubin for
    ``cc``; ``prefer="ptx"`` compiles PTX with NVVM alone (no GPU needed), which the driver JITs.

    Example::

        img = xlakern._numba_cuda.kernel_image(kern, (numba.types.float32[::1],) * 2, cc=(9, 0), prefer="ptx")
    """
    cuda = import_numba_cuda()
    name = getattr(dispatcher, "__name__", "kernel")
    if prefer == "ptx":
        options = dict(dispatcher.targetoptions)
        if options.get("debug"):
            raise CallError(f"numba_cuda_kernel: '{name}' was compiled with debug=True; compile without it")
        ptx, _ = cuda.compile_ptx(dispatcher.py_func, tuple(arg_types), cc=cc,
                                  fastmath=bool(options.get("fastmath", False)),
                                  lineinfo=bool(options.get("lineinfo", False)))
        found = re.search(r"\.entry\s+([A-Za-z0-9_$.]+)\s*\(", ptx)
        if found is None:
            raise CallError(f"numba_cuda_kernel: no kernel entry found in the PTX of '{name}'")
        return KernelImage("ptx", ptx.encode() + b"\0", found.group(1))
    if prefer != "cubin":
        raise SpecError(f"prefer must be 'cubin' or 'ptx'; got {prefer!r}")
    kern = dispatcher.compile(tuple(arg_types))
    _reject_unsupported(kern, name)
    cubin = _compat.cuda_code_library(kern).get_cubin(cc=cc)
    return KernelImage("cubin", bytes(getattr(cubin, "code", cubin)), kern.entry_name)


def _gpu_compute_capability() -> tuple[int, int] | None:
    """The compute capability shared by every GPU JAX sees (None if they differ: then PTX is used)."""
    ccs = _toolchain.gpu_compute_capabilities()
    if not ccs:
        raise CallError("numba_cuda_kernel runs on an NVIDIA GPU, and JAX sees none. Install jax[cuda13] "
                        "on a machine with a GPU, or use numba_kernel for CPU kernels")
    return ccs[0] if len(set(ccs)) == 1 else None


def _numba_cuda_version() -> str:
    try:
        return metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:  # the numba.cuda that ships inside numba
        return "numba-builtin"


def _encode_image(image: KernelImage) -> bytes:
    return json.dumps({"kind": image.kind, "entry": image.entry}).encode() + b"\n" + image.data


def _decode_image(payload: bytes) -> KernelImage:
    header, _, data = payload.partition(b"\n")
    fields = json.loads(header)
    return KernelImage(str(fields["kind"]), data, str(fields["entry"]))


def cached_kernel_image(kernel: Any, fp: Fingerprint, dtypes: tuple[str, ...], ranks: tuple[int, ...],
                        cc: tuple[int, int] | None, prefer: str | None = None) -> KernelImage:
    """:func:`kernel_image` of ``kernel`` for C-contiguous arrays, through xlakern's cache.

    A kernel with a portable fingerprint is compiled once per machine: its cubin (PTX when
    ``cc`` is None or ``prefer="ptx"``) and entry name are stored under a key of its content,
    the signature, the target and the Numba versions, and a later process loads them without
    Numba's compiler.

    Example::

        img = cached_kernel_image(kern, fingerprint_dispatcher(kern), ("float32",) * 2, (1, 1), (9, 0))
    """
    prefer = prefer or ("cubin" if cc else "ptx")
    key = None
    if fp.portable:
        key = _numba_store.disk_key(_numba_store.CUDA_KIND, _IMAGE_VERSION, _numba_cuda_version(), fp.digest,
                                    dtypes, ranks, cc, prefer)
        payload = _numba_store.load(_numba_store.CUDA_KIND, key)
        if payload is not None:
            try:
                return _decode_image(payload)
            except (ValueError, KeyError, TypeError):
                pass  # not an image this version wrote: compile and replace it
    cuda = import_numba_cuda()
    compiled = without_body_imports(kernel, cuda.jit(**dict(kernel.targetoptions)))
    with Progress(f"compiling numba kernel {kernel.__name__}", quiet=False):
        image = kernel_image(compiled, _array_types(dtypes, ranks), cc=cc, prefer=prefer)
    if key is not None:
        _numba_store.store(_numba_store.CUDA_KIND, key, _encode_image(image))
    return image


# The registered kernel images.
_IMAGES = RegisteredKernels(_IMAGE_VERSION)


def _registered_image(kernel: Any, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int,
                      grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int) -> str:
    """The runtime key of this kernel specialisation's image, compiling and registering it on first use."""
    cc = _gpu_compute_capability()

    def compile_and_register(key: str, fp: Fingerprint) -> KernelImage:
        try:
            image = cached_kernel_image(kernel, fp, dtypes, ranks, cc)
        except CallError:
            raise
        except Exception as e:
            sig = ", ".join(str(t) for t in _array_types(dtypes, ranks))
            raise CallError(f"numba_cuda_kernel: Numba could not compile '{kernel.__name__}' for ({sig}): "
                            f"{type(e).__name__}: {e}") from e
        _runtime.register_cuda_image_kernel(key, kernel.__name__, image.data, image.entry, list(dtypes),
                                            list(ranks), n_inputs, grid, block, shared_mem)
        return image

    parts = (dtypes, ranks, n_inputs, grid, block, shared_mem, cc)
    return _IMAGES.kernel_for(kernel, parts, compile_and_register).key


class NumbaCudaKernel(BridgeOp):
    """A ``@cuda.jit`` kernel as a function of JAX GPU arrays; made by :func:`numba_cuda_kernel`."""

    wrapper = "numba_cuda_kernel"
    target = _bridge.CUDA_IMAGE_TARGET
    dtypes = NUMBA_CUDA_DTYPES
    platform = "gpu"
    kind = "Numba CUDA kernels"

    def __init__(self, kernel: Any, outs: Any, grid: tuple[int, int, int], block: tuple[int, int, int],
                 shared_mem: int, vmap_method: str | None, input_output_aliases: Mapping[int, int] | None,
                 zeroed_outputs: Any = None):
        self.kernel = kernel
        self.grid, self.block, self.shared_mem = grid, block, shared_mem
        super().__init__(getattr(kernel, "__name__", "kernel"), kernel.py_func, outs, vmap_method,
                         input_output_aliases, zeroed_outputs,
                         {"grid": grid, "block": block, "shared_mem": shared_mem})

    def __repr__(self) -> str:
        return f"<xlakern numba_cuda_kernel {self.__name__}: grid {self.grid}, block {self.block}>"

    def _register(self, dtypes: tuple[str, ...], ranks: tuple[int, ...], n_inputs: int) -> str:
        return _registered_image(self.kernel, dtypes, ranks, n_inputs, self.grid, self.block, self.shared_mem)


def numba_cuda_kernel(kernel: Any, outs: Any, *, grid: Any = None, block: Any = None, launch_dims: Any = None,
                      threads_per_block: int = 256, shared_mem: int = 0, vmap_method: str | None = None,
                      input_output_aliases: Mapping[int, int] | None = None,
                      zeroed_outputs: Any = None) -> NumbaCudaKernel:
    """Wrap a ``@cuda.jit`` kernel as a JAX operation on GPU arrays, launched from C++.

    Give either ``grid`` and ``block`` (ints or tuples of up to 3), or ``launch_dims`` (total
    threads per dimension; see :func:`numba_cuda_launch_config`). ``shared_mem`` is dynamic
    shared memory in bytes. The kernel takes its inputs, then one array per output. The result
    has the structure of ``outs``. Launches run on XLA's stream with no Python per call and can
    be captured into CUDA graphs. With ``vmap_method="broadcast_all"`` (or ``"expand_dims"``),
    a batched call launches the kernel once per batch element, all from one FFI call.

    ``zeroed_outputs`` (output indices, ``True`` for all, or a callable of
    ``{"grid", "block", "shared_mem"}`` returning indices) clears those outputs with
    ``cuMemsetD8Async`` on XLA's stream before the launch, inside the same FFI call (so CUDA
    graphs capture it too): what ``cuda.atomic.add`` into an output needs.

    Example::

        @cuda.jit
        def add(x, y, out):
            i = cuda.grid(1)
            if i < out.size:
                out[i] = x[i] + y[i]

        f = xlakern.numba_cuda_kernel(add, outs=jax.ShapeDtypeStruct((1024,), jnp.float32), launch_dims=1024)
        z = jax.jit(f)(a, b)
    """
    g, b, smem = _launch(grid, block, launch_dims, threads_per_block, shared_mem)
    if not _compat.is_cuda_dispatcher(kernel):
        hint = " (an @numba.njit kernel: use numba_kernel)" if hasattr(kernel, "targetoptions") else ""
        raise CallError(f"numba_cuda_kernel needs a @numba.cuda.jit kernel; got {type(kernel).__name__}{hint}")
    return NumbaCudaKernel(kernel, outs, g, b, smem, vmap_method, input_output_aliases, zeroed_outputs)


# --------------------------------------------------------------------------- the callable bridge's names

# numba_cuda_callable moved to its own bridge module; these names stay importable from here.
# Looked up on first use, so neither module imports the other while it loads.
_MOVED_TO_PYTHON_CALLABLE = frozenset(["NumbaCudaCallable", "numba_cuda_callable", "_hoisted_twin"])


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_PYTHON_CALLABLE:
        from . import _python_callable

        return getattr(_python_callable, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
