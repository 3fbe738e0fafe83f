"""`KernelSwap`: a Python function run with the kernels it references swapped for twins.

Plain Python objects stand in for kernels here (the twin of a `Kernel` is its `.twin`), so
these tests need neither Numba nor a GPU; tests/test_seed_numba_cuda.py covers the real
`numba_cuda_callable` case.
"""

from __future__ import annotations

import types

from xlakern._hoist import KernelSwap


class Kernel:
    def __init__(self, name: str):
        self.name = name
        self.twin = types.SimpleNamespace(name=f"{name}'")


def twin_of(value):
    return value.twin if isinstance(value, Kernel) else value


SOURCE = """
scale = 2
first = Kernel("first")

def pipeline(x):
    helper = lambda v: (second.name, v)   # nested code reads globals too
    return first.name, helper(x * scale), len([x])

def counter():
    global calls
    calls = calls + 1
    return first.name
"""


def test_globals_swapped_privately_and_refreshed_live():
    ns = {"__name__": "fake_user_module", "Kernel": Kernel}
    exec(compile(SOURCE, "<fake user module>", "exec"), ns)
    ns["second"] = Kernel("second")
    original_first, original_second = ns["first"], ns["second"]
    swap = KernelSwap(ns["pipeline"], twin_of)
    run = swap.function()
    assert run is not ns["pipeline"] and run.__code__ is ns["pipeline"].__code__
    assert run(3) == ("first'", ("second'", 6), 1)  # builtins (len) still resolve
    assert ns["first"] is original_first and ns["second"] is original_second
    assert ns["pipeline"](3) == ("first", ("second", 6), 1)
    # Rebinding names in the module reaches the twin at the next refresh; the object stays.
    ns["scale"] = 5
    ns["first"] = Kernel("renamed")
    again = swap.function()
    assert again is run and again(3) == ("renamed'", ("second'", 15), 1)
    del ns["second"]
    try:
        swap.function()(1)
    except NameError as e:
        assert "second" in str(e)
    else:
        raise AssertionError("a name the module no longer binds must not survive in the twin")


def test_closure_cells_swapped_and_functions_without_kernels_untouched():
    def make(kernel, factor):
        def use(x):
            return kernel.name, x * factor
        return use

    k = Kernel("cell")
    use = make(k, 3)
    run = KernelSwap(use, twin_of).function()
    assert run(2) == ("cell'", 6) and use(2) == ("cell", 6)
    cell = use.__closure__[use.__code__.co_freevars.index("kernel")]
    assert cell.cell_contents is k  # the user's cell is untouched
    plain = make("not a kernel", 4)
    assert KernelSwap(plain, twin_of).function() is plain


def test_functions_that_assign_globals_run_as_they_are():
    ns = {"__name__": "fake_user_module", "Kernel": Kernel, "calls": 0}
    exec(compile(SOURCE, "<fake user module>", "exec"), ns)
    swap = KernelSwap(ns["counter"], twin_of)
    assert swap.function() is ns["counter"]
    assert swap.function()() == "first" and ns["calls"] == 1  # its write reached the module
    assert KernelSwap(print, twin_of).function() is print  # not a Python function
