"""One of each: the exception hierarchy in errors.py, one compute-capability probe, one array-description check."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import xlakern
from xlakern import _arrays, _toolchain, errors


def test_every_exception_lives_in_errors_and_is_exported():
    defined = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, (errors.XlakernError, errors.NotReproducibleWarning))}
    assert defined == set(errors.__all__)
    for name in defined:
        assert getattr(xlakern, name) is getattr(errors, name)
        assert name in xlakern.__all__
    # Old import locations keep working.
    from xlakern._primitive import BackendError, KernelGenerationError
    from xlakern._warp import WarpNotInstalledError, WarpTypeError
    from xlakern.config import PlatformError

    assert (BackendError, KernelGenerationError, WarpNotInstalledError, WarpTypeError, PlatformError) == (
        errors.BackendError, errors.KernelGenerationError, errors.WarpNotInstalledError, errors.WarpTypeError,
        errors.PlatformError)


def test_every_public_name_is_in_the_api_reference():
    # docs/api.rst lists each object by hand; a name added to xlakern.__all__ and not to the reference
    # would be public and undocumented. Exempt: the module attributes, the primitives (the reference
    # describes the *_p objects behind each operator in prose) and aliases of documented objects
    # (BrainEvent's error names).
    text = (Path(__file__).resolve().parents[1] / "docs" / "api.rst").read_text()
    documented = set(re.findall(r"^\.\. auto(?:function|class|exception|module):: ([\w.]+)", text, re.M))
    documented_objects = {id(getattr(xlakern, name.rsplit(".", 1)[-1], None)) for name in documented}
    missing = []
    for name in xlakern.__all__:
        obj = getattr(xlakern, name)
        if name in ("__version__", "event") or isinstance(obj, xlakern.XLACustomKernel):
            continue
        if not ({name, f"xlakern.{name}", f"xlakern.event.{name}"} & documented) and id(obj) not in documented_objects:
            missing.append(name)
    assert not missing, f"public names missing from docs/api.rst: {missing}"


class _FakeGpu:
    def __init__(self, compute_capability):
        self.compute_capability = compute_capability


def test_one_probe_reads_every_gpu_and_builds_run_on_all_of_them(monkeypatch):
    monkeypatch.setattr(jax, "devices", lambda *a: [_FakeGpu("9.0"), _FakeGpu("8.6"), _FakeGpu("12.0")])
    assert _toolchain.gpu_compute_capabilities() == ((9, 0), (8, 6), (12, 0))
    assert _toolchain.gpu_compute_capability() == "86"  # its PTX runs on the newer two
    monkeypatch.setattr(jax, "devices", lambda *a: [_FakeGpu("9.0")] * 2)
    assert _toolchain.gpu_compute_capability() == "90"

    def no_gpu(*a):
        raise RuntimeError("Unknown backend gpu")

    monkeypatch.setattr(jax, "devices", no_gpu)
    assert _toolchain.gpu_compute_capabilities() == ()
    assert _toolchain.gpu_compute_capability() is None


def test_array_descriptions():
    for x in (jax.ShapeDtypeStruct((2, 3), jnp.float32), np.zeros(3, np.int8), jnp.ones(2)):
        assert _arrays.describes_array(x)
        assert _arrays.as_struct(x) == jax.ShapeDtypeStruct(tuple(x.shape), np.dtype(x.dtype))
    for x in ([1, 2], 3.0, None, "x"):
        assert not _arrays.describes_array(x)
    struct = _arrays.as_struct(jax.ShapeDtypeStruct((np.int64(4),), jnp.bfloat16))
    assert type(struct.shape[0]) is int and isinstance(struct.dtype, np.dtype)


def test_jax_internals_are_read_in_compat_only():
    package = Path(xlakern.__file__).resolve().parent
    users = sorted(str(p.relative_to(package)) for p in package.rglob("*.py")
                   if p.name != "_compat.py" and re.search(r"^\s*(from|import) jax\._src", p.read_text(), re.M))
    assert users == [], users
