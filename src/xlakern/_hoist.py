"""Kernels that import inside their body (``import math`` in a ``@cuda.jit`` function).

Numba rejects the ``IMPORT_NAME`` opcode, yet tutorials (BrainEvent's among them) write kernels
that way. Before compiling such a kernel, xlakern rebuilds it once from its source with those
import statements run up front and their names passed in like closure values, then compiles
the rebuilt function with the same Numba options. Kernels without imports are used as they are.

A Python function that launches such kernels itself (``numba_cuda_callable``) gets the same
treatment through :class:`KernelSwap`: it runs as a twin function object with the same code,
whose private globals and closure cells hold the hoisted kernels in place of the originals.
"""

from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import threading
import types
from typing import Any, Callable

_lock = threading.Lock()
# id(dispatcher) -> (dispatcher, its rebuilt twin); holding the original keeps its id unique.
_rebuilt: dict[int, tuple[Any, Any]] = {}


def _imports_inside(code: Any) -> bool:
    return any(ins.opname == "IMPORT_NAME" for ins in dis.get_instructions(code))


class _StripImports(ast.NodeTransformer):
    """Replaces import statements of the kernel body (not of nested functions) with ``pass``."""

    def __init__(self) -> None:
        self.imports: list[ast.stmt] = []
        self.depth = 0

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        self.depth += 1
        if self.depth == 1:
            node.decorator_list = []
            self.generic_visit(node)
        self.depth -= 1
        return node

    def _strip(self, node: ast.stmt) -> Any:
        self.imports.append(node)
        return ast.copy_location(ast.Pass(), node)

    visit_Import = _strip
    visit_ImportFrom = _strip


def _rebuild(fn: Any) -> Any | None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    tree = ast.parse(source)
    if not tree.body or not isinstance(tree.body[0], ast.FunctionDef):
        return None
    stripper = _StripImports()
    func = stripper.visit(tree.body[0])
    imported: dict[str, Any] = {}
    exec(compile(ast.Module(body=stripper.imports, type_ignores=[]), "<kernel imports>", "exec"), imported)
    imported.pop("__builtins__", None)
    freevars = fn.__code__.co_freevars
    params = list(freevars) + [n for n in imported if n not in freevars]
    factory = ast.FunctionDef(
        name="__xlakern_factory__",
        args=ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params], kwonlyargs=[], kw_defaults=[],
                           defaults=[]),
        body=[func, ast.Return(value=ast.Name(id=func.name, ctx=ast.Load()))],
        decorator_list=[], returns=None)
    if "type_params" in ast.FunctionDef._fields:  # Python 3.12+
        factory.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    namespace: dict[str, Any] = {}
    exec(compile(module, inspect.getsourcefile(fn) or "<kernel>", "exec"), fn.__globals__, namespace)
    cells = {name: cell.cell_contents for name, cell in zip(freevars, fn.__closure__ or ())}
    values = [cells[p] if p in cells else imported[p] for p in params]
    rebuilt = namespace["__xlakern_factory__"](*values)
    rebuilt.__defaults__ = fn.__defaults__
    return rebuilt


def without_body_imports(dispatcher: Any, decorate: Callable[[Any], Any]) -> Any:
    """``dispatcher``, or an equivalent one compiled from its function with body imports hoisted.

    ``decorate(function)`` makes a dispatcher with the original's options.
    """
    known = _rebuilt.get(id(dispatcher))
    if known is not None:
        return known[1]
    fn = dispatcher.py_func
    if not _imports_inside(fn.__code__):
        with _lock:  # remembered too, so a later look-up is one dict access
            return _rebuilt.setdefault(id(dispatcher), (dispatcher, dispatcher))[1]
    with _lock:
        known = _rebuilt.get(id(dispatcher))
        if known is None:
            try:
                rebuilt = _rebuild(fn)
                done = dispatcher if rebuilt is None else decorate(rebuilt)
            except Exception:
                done = dispatcher  # Numba then reports the import itself
            known = _rebuilt[id(dispatcher)] = (dispatcher, done)
    return known[1]


def _code_objects(code: Any) -> list[Any]:
    found = [code]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found += _code_objects(const)
    return found


class KernelSwap:
    """Runs a Python function with the kernels it references swapped for their hoisted twins.

    ``twin(value)`` returns the value to use instead of ``value`` (itself for anything that is
    not a kernel needing a twin). :meth:`function` refreshes the swap from the function's live
    module globals and closure cells (call it at trace time, not per execution) and returns the
    function to run: the original when nothing needs swapping, else one twin function object
    that shares the original's code, whose globals are a private dict holding only the names the
    code reads. The user's module globals are never written.

    Functions that assign globals (``global x; x = ...``) are run as they are: their writes must
    reach the module.
    """

    def __init__(self, func: Any, twin: Callable[[Any], Any]):
        self.original = func
        self._twin = twin
        self._swapped: Any = None
        code = getattr(func, "__code__", None)
        usable = isinstance(func, types.FunctionType) and code is not None
        if usable:
            codes = _code_objects(code)
            usable = not any(ins.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")
                             for c in codes for ins in dis.get_instructions(c))
        self._names = sorted({n for c in _code_objects(code) for n in c.co_names}) if usable else []
        self._usable = usable

    def function(self) -> Any:
        if not self._usable:
            return self.original
        func = self.original
        module = func.__globals__
        cells = func.__closure__ or ()
        if self._swapped is None:
            needed = any(self._twin(module[n]) is not module[n] for n in self._names if n in module) or any(
                self._twin(_cell_value(c)) is not _cell_value(c) for c in cells)
            if not needed:
                return func
            private = {"__builtins__": module.get("__builtins__", __builtins__), "__name__": module.get("__name__")}
            closure = tuple(types.CellType() for _ in cells) or None
            swapped = types.FunctionType(func.__code__, private, func.__name__, func.__defaults__, closure)
            swapped.__kwdefaults__ = func.__kwdefaults__
            swapped.__qualname__ = func.__qualname__
            swapped.__doc__ = func.__doc__
            swapped.__dict__.update(func.__dict__)
            self._swapped = swapped
        swapped = self._swapped
        private = swapped.__globals__
        for n in self._names:  # refreshed in place: the twin function object stays the same
            if n in module:
                private[n] = self._twin(module[n])
            else:
                private.pop(n, None)  # builtins, or a name the module has not bound (yet)
        for mine, theirs in zip(swapped.__closure__ or (), cells):
            value = _cell_value(theirs)
            if value is _EMPTY:
                if _cell_value(mine) is not _EMPTY:
                    del mine.cell_contents
            else:
                mine.cell_contents = self._twin(value)
        return swapped


_EMPTY = object()


def _cell_value(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an unbound cell
        return _EMPTY
