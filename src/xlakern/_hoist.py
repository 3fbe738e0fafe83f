"""Kernels that import inside their body (``import math`` in a ``@cuda.jit`` function).

Numba rejects the ``IMPORT_NAME`` opcode, yet tutorials (BrainEvent's among them) write kernels
that way. Before compiling such a kernel, xlakern rebuilds it once from its source with those
import statements run up front and their names passed in like closure values, then compiles
the rebuilt function with the same Numba options. Kernels without imports are used as they are.
"""

from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import threading
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
    fn = dispatcher.py_func
    if not _imports_inside(fn.__code__):
        return dispatcher
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
