"""The one dtype table (xlakern._dtypes) against every other list of element types.

Python's lists are derived from the table; C++ keeps its own spellings, so the C++ ones are
compiled (the public headers) or read (the runtime's source) and compared entry by entry.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import xlakern
from xlakern import _calling, _dtypes, _numba_cpu, _numba_cuda, _spec, _toolchain, _warp

REPO = Path(__file__).resolve().parents[1]


def test_table_holds_the_15_jax_dtypes_with_numpys_sizes():
    names = [d.name for d in _dtypes.DTYPES]
    assert len(names) == len(set(names)) == 15
    for d in _dtypes.DTYPES:
        assert np.dtype(d.name).name == d.name
        assert np.dtype(d.name).itemsize == d.itemsize


def test_python_lists_come_from_the_table():
    assert _calling.SUPPORTED_DTYPES == {d.name for d in _dtypes.DTYPES}
    numba = {d.name for d in _dtypes.DTYPES if d.numba}
    assert _numba_cpu.NUMBA_CPU_DTYPES == numba == _numba_cuda.NUMBA_CUDA_DTYPES
    assert _spec.ATTR_TYPES == {d.name: d.attr_cpp_type for d in _dtypes.DTYPES if d.attr_cpp_type}
    assert _warp.WARP_SCALARS == {d.name: d.warp_scalar for d in _dtypes.DTYPES if d.warp_scalar}


def _cpp_view_of_the_headers(tmp_path: Path) -> str:
    """What the public headers say about each table entry, from a program compiled against them."""
    lines = ["#include <cstdio>", '#include "xlakern/ffi_frame.h"', "int main() {",
             '  std::printf("count %d max_dims %d\\n", xk::kNumDTypes, XK_MAX_DIMS);',
             "  for (int i = 0; i < xk::kNumDTypes; ++i) {",
             "    auto dt = static_cast<xk::DType>(i);",
             '    std::printf("enum %d %s %d\\n", i, xk::dtype_name(dt), static_cast<int>(xk::dtype_size(dt)));',
             "  }"]
    for d in _dtypes.DTYPES:
        lines.append(f'  std::printf("entry {d.name} %d %d\\n", static_cast<int>(xk::DType::{d.cpp_enum}), '
                     f"static_cast<int>(xk::frame::dtype_from_xla(XLA_FFI_DataType_{d.xla_type})));")
    # The XLA scalar type the frame glue expects for an attribute of each C++ type, beside the type of
    # the entry that C++ type belongs to (float16/bfloat16 attributes travel as their uint16 bits).
    natural = {d.attr_cpp_type: d for d in _dtypes.DTYPES if d.attr_cpp_type and d.name not in ("float16", "bfloat16")}
    for cpp, d in natural.items():
        lines.append(f'  std::printf("attr {d.name} %d %d\\n", static_cast<int>(xk::frame::AttrType<{cpp}>::kType), '
                     f"static_cast<int>(XLA_FFI_DataType_{d.xla_type}));")
    lines.append("}")
    src = tmp_path / "dtypes.cc"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "dtypes"
    host = _toolchain.host_compiler()
    subprocess.run([*host.command, "-std=c++17", f"-I{_toolchain.include_dir()}",
                    f"-I{_toolchain.ffi_include_dir()}", str(src), "-o", str(exe)], check=True, timeout=300)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60).stdout


def test_public_headers_match_the_table(tmp_path):
    out = _cpp_view_of_the_headers(tmp_path)
    count, max_dims = map(int, re.search(r"count (\d+) max_dims (\d+)", out).groups())
    assert count == len(_dtypes.DTYPES)
    assert max_dims == _calling._MAX_DIMS
    # xk::DType: enumerator i is entry i, with its name and size (dtype.h).
    enums = re.findall(r"enum (\d+) (\S+) (\d+)", out)
    assert [(name, int(size)) for _, name, size in enums] == [(d.name, d.itemsize) for d in _dtypes.DTYPES]
    # Each entry's xk::DType enumerator, and the XLA type that ffi_frame.h maps to it.
    for i, d in enumerate(_dtypes.DTYPES):
        found = re.search(rf"entry {d.name} (-?\d+) (-?\d+)", out).groups()
        assert tuple(map(int, found)) == (i, i), d
    attrs = re.findall(r"attr (\w+) (-?\d+) (-?\d+)", out)
    assert sorted(name for name, _, _ in attrs) == sorted(
        d.name for d in _dtypes.DTYPES if d.attr_cpp_type and d.name not in ("float16", "bfloat16"))
    for name, sent, own in attrs:
        assert sent == own, name


def test_runtime_table_matches_the_table():
    source = REPO / "csrc" / "kernel_args.cc"
    if not source.is_file():
        pytest.skip("the runtime's sources are not beside the tests")
    text = source.read_text()
    table = re.search(r"kDTypes\[\]\s*=\s*\{(.*?)\n\};", text, re.S)
    if table is None:  # the table is built from another list: that list is what to read then
        pytest.fail("csrc/kernel_args.cc has no kDTypes[] = {...} table to check; update this test")
    rows = re.findall(r'\{"(\w+)",\s*ffi::DataType::(\w+),\s*(\d+)\}', table.group(1))
    assert [(n, x, int(s)) for n, x, s in rows] == [(d.name, d.xla_type, d.itemsize) for d in _dtypes.DTYPES]
