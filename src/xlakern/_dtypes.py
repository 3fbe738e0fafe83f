"""The one table of element types: the 15 JAX dtypes and what each part of xlakern does with them.

Every other dtype list in the package is derived from :data:`DTYPES`. The C++ side keeps its
own spellings (``xk::DType`` in ``include/xlakern/dtype.h``, the runtime's table in
``csrc/kernel_args.cc``, the XLA mapping in ``include/xlakern/ffi_frame.h``);
a test compiles and reads them and checks them against this table, entry by entry and in this order.

Example::

    >>> from xlakern._dtypes import NUMBA_DTYPES, SUPPORTED_DTYPES
    >>> sorted(SUPPORTED_DTYPES - NUMBA_DTYPES)
    ['bfloat16']
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class DTypeInfo:
    """One element type, as NumPy, XLA, xlakern's C++ API and the kernel languages name it."""

    name: str  # NumPy's name, which xlakern uses everywhere in Python
    itemsize: int  # bytes per element
    xla_type: str  # the xla::ffi::DataType enumerator
    cpp_enum: str  # the xk::DType enumerator (BrainEvent's spelling)
    attr_cpp_type: str | None  # C++ parameter type of an attribute of this type; None: no attribute takes it
    numba: bool  # Numba kernels (CPU and CUDA) take arrays of it
    warp_scalar: str | None  # the warp scalar type's name; None: Warp has none


# In xk::DType's order (its enumerator values are the positions here).
DTYPES: tuple[DTypeInfo, ...] = (
    DTypeInfo("bool", 1, "PRED", "Bool", "bool", True, "bool"),
    DTypeInfo("int8", 1, "S8", "Int8", "int8_t", True, "int8"),
    DTypeInfo("int16", 2, "S16", "Int16", "int16_t", True, "int16"),
    DTypeInfo("int32", 4, "S32", "Int32", "int32_t", True, "int32"),
    DTypeInfo("int64", 8, "S64", "Int64", "int64_t", True, "int64"),
    DTypeInfo("uint8", 1, "U8", "UInt8", "uint8_t", True, "uint8"),
    DTypeInfo("uint16", 2, "U16", "UInt16", "uint16_t", True, "uint16"),
    DTypeInfo("uint32", 4, "U32", "UInt32", "uint32_t", True, "uint32"),
    DTypeInfo("uint64", 8, "U64", "UInt64", "uint64_t", True, "uint64"),
    # 16-bit float attributes travel as their raw bits: the C++ parameter is uint16_t.
    DTypeInfo("float16", 2, "F16", "Float16", "uint16_t", True, "float16"),
    # Numba has no bfloat16 type.
    DTypeInfo("bfloat16", 2, "BF16", "BFloat16", "uint16_t", False, None),
    DTypeInfo("float32", 4, "F32", "Float32", "float", True, "float32"),
    DTypeInfo("float64", 8, "F64", "Float64", "double", True, "float64"),
    # XLA's FFI has no complex attributes.
    DTypeInfo("complex64", 8, "C64", "Complex64", None, True, None),
    DTypeInfo("complex128", 16, "C128", "Complex128", None, True, None),
)

# Element types an xk::Tensor can carry (every one of the table).
SUPPORTED_DTYPES = frozenset(d.name for d in DTYPES)
# Element types Numba kernels take, on the CPU and the GPU alike.
NUMBA_DTYPES = frozenset(d.name for d in DTYPES if d.numba)
# Attribute types of an arg_spec (``attr.NAME:TYPE``) -> the C++ type the handler decodes.
ATTR_CPP_TYPES = {d.name: d.attr_cpp_type for d in DTYPES if d.attr_cpp_type is not None}
# dtype name -> Warp scalar type name.
WARP_SCALARS = {d.name: d.warp_scalar for d in DTYPES if d.warp_scalar is not None}

