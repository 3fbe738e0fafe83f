"""Helpers shared by the benchmark scripts in ``bench/`` (one copy, imported by each script).

The scripts are run as ``python bench/bench_X.py``, so ``bench/`` is ``sys.path[0]`` and they
import this module as ``from _benchlib import ...``. Importing it:

- restores ``np.row_stack`` where NumPy removed it (numba-cuda, imported by some BrainEvent and
  GPU paths, still uses it), before jax or brainevent is imported;
- imports ``jax`` and ``xlakern``, and tries ``brainevent``: ``brainevent`` is the module or
  None, ``BE_ERROR`` says why it is None, and ``NA_BE`` is the text of a BrainEvent cell that
  cannot be computed.

What it offers: cell formatting (:func:`fmt_t`, :func:`clean`, :func:`err_cell`,
:func:`ratio`), the Markdown / JSON :class:`Table`, timing (:func:`time_fn`, a median),
one timed cell (:func:`timed_call_cell`), module caching (:func:`loaded`), the machine description (:func:`machine_info`,
:func:`print_header`), and the section loop and run epilogue (:func:`run_sections`,
:func:`finish`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

# numba-cuda (imported by some BrainEvent paths and by GPU sections) still uses np.row_stack,
# which NumPy 2.5 removed.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack  # type: ignore[attr-defined]

import xlakern

# `--graph-loops` on any bench script: XLA reads its flags once, when JAX starts, so they are set
# here, before anything (BrainEvent's import included) can start a backend.
GRAPH_LOOPS = "--graph-loops" in sys.argv
if GRAPH_LOOPS:
    xlakern.config.enable_cuda_graph_loops()

import jax
import jax.numpy as jnp

try:
    import brainevent  # noqa: F401

    BE_ERROR: str | None = None
except Exception as _e:  # not installed, or broken
    brainevent = None  # type: ignore[assignment]
    if isinstance(_e, ModuleNotFoundError) and _e.name == "brainevent":
        BE_ERROR = "n/a (brainevent not installed)"
    else:
        BE_ERROR = f"n/a (brainevent import failed: {type(_e).__name__}: {_e})"

NA_BE = BE_ERROR or "n/a"


def hashed_spikes(step: Any, n: int, rate: float, batch: int | None = None) -> Any:
    """Spikes of one step: a stateless integer hash of (neuron, step) below ``rate * 2**32``.

    One elementwise fusion inside a loop body, so no scanned array is sliced per step (XLA keeps
    dynamic slices of scanned inputs out of CUDA graphs) and every library gets the same spikes.
    ``batch`` gives shape (n, batch) instead of (n,)."""
    shape = (n,) if batch is None else (n, batch)
    x = jax.lax.iota(jnp.uint32, n * (batch or 1)).reshape(shape) * jnp.uint32(0x9E3779B1)
    x = x + jnp.asarray(step).astype(jnp.uint32) * jnp.uint32(0x85EBCA77)
    x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
    x = x ^ (x >> 16)
    return x < jnp.uint32(min(int(rate * 2**32), 2**32 - 1))


def hashed_trains(steps: int, n: int, rate: float, batch: int | None = None) -> Any:
    """The (steps, n[, batch]) spikes :func:`hashed_spikes` gives, for checks outside a loop."""
    return jnp.stack([hashed_spikes(t, n, rate, batch) for t in range(steps)])


MIN_SAMPLES = 5  # time_fn with a budget stops early only once it has this many samples

__all__ = [
    "BE_ERROR", "GRAPH_LOOPS", "MIN_SAMPLES", "NA_BE", "hashed_spikes", "hashed_trains", "Table", "brainevent", "clean", "err_cell", "finish", "fmt_t",
    "loaded", "log", "machine_info", "print_header", "ratio", "run_sections", "time_fn", "timed_call_cell",
]


# --------------------------------------------------------------------------------------------
# Cells and tables
# --------------------------------------------------------------------------------------------


def fmt_t(sec: float | None) -> str:
    """A duration in seconds as a short string in µs, ms or s ("n/a" for None)."""
    if sec is None:
        return "n/a"
    if sec < 1e-3:
        return f"{sec * 1e6:.3g} µs" if sec * 1e6 < 100 else f"{sec * 1e6:.0f} µs"
    if sec < 1:
        return f"{sec * 1e3:.3g} ms"
    return f"{sec:.3g} s"


def clean(msg: str, limit: int = 160) -> str:
    """One line fit for a Markdown cell: whitespace collapsed, '|' replaced, cut to `limit` characters."""
    msg = " ".join(str(msg).split()).replace("|", "/")
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"


def err_cell(e: BaseException) -> str:
    """The cell that reports an exception: 'error: Type: message'."""
    return "error: " + clean(f"{type(e).__name__}: {e}")


def ratio(num: float | None, den: float | None) -> str:
    """num / den as '1.23×', or '' when either is missing or zero."""
    if not num or not den:
        return ""
    return f"{num / den:.2f}×"


class Table:
    """One result table: a title, an optional note, rows of cells, and per-row data for the JSON output."""

    def __init__(self, key: str, title: str, headers: list[str], note: str = ""):
        """A table named `key` (JSON) with a Markdown `title`, column `headers` and a `note` under the title."""
        self.key, self.title, self.headers, self.note = key, title, headers, note
        self.rows: list[list[str]] = []
        self.data: list[dict[str, Any]] = []

    def add(self, cells: list[str], data: dict[str, Any] | None = None) -> None:
        """Append a row of cells (each cleaned for Markdown) and its raw data."""
        self.rows.append([clean(c, 400) for c in cells])
        self.data.append(data or {})

    def markdown(self) -> str:
        """The table as a Markdown section: '### title', the note, the pipe table."""
        out = [f"### {self.title}", ""]
        if self.note:
            out += [self.note, ""]
        out.append("| " + " | ".join(self.headers) + " |")
        out.append("|" + "|".join("---" for _ in self.headers) + "|")
        out += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(out) + "\n"

    def as_json(self) -> dict[str, Any]:
        """The table (cells and raw data) as a JSON-ready dict."""
        return {"key": self.key, "title": self.title, "note": self.note, "headers": self.headers,
                "rows": self.rows, "data": self.data}


# --------------------------------------------------------------------------------------------
# Timing and module caching
# --------------------------------------------------------------------------------------------


def time_fn(fn: Callable[..., Any], args: tuple, runs: int, budget: float | None = None,
            warmup: int = 3) -> tuple[float, list[float], Any]:
    """Median, samples and last output of `runs` timed calls after `warmup`; a `budget` (s) may stop it early.

    Each call's output is released before the next call starts, as a simulation loop that donates
    its state does. Holding it instead moves the next output to another address, and XLA then
    updates every node of a recorded CUDA graph on each call (``bench_graph_update.py``)."""
    # With a budget, timing stops once past `budget` seconds and at least min(runs, MIN_SAMPLES)
    # samples are in; without one, all `runs` calls are timed.
    out = None
    for _ in range(warmup):
        out = None
        out = jax.block_until_ready(fn(*args))
    samples: list[float] = []
    t_end = None if budget is None else time.perf_counter() + budget
    while len(samples) < runs:
        out = None
        t = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t)
        if t_end is not None and len(samples) >= min(runs, MIN_SAMPLES) and time.perf_counter() > t_end:
            break
    return statistics.median(samples), samples, out


def timed_call_cell(make: Callable[[], Callable[..., Any]], args: tuple, runs: int,
                    matches: Callable[[Any], bool]) -> tuple[str, dict[str, Any], bool | None]:
    """(cell, data, matched) for f = make() timed per call by time_fn; any exception becomes an error cell."""
    # matches(out) checks the last output (it may raise to turn the cell into an error);
    # matched is None when the cell is an error.
    try:
        f = make()
        med, samples, out = time_fn(f, args, runs)
        ok = matches(out)
    except Exception as e:  # noqa: BLE001
        cell = err_cell(e)
        return cell, {"error": cell}, None
    return fmt_t(med), {"per_call_s": med, "samples_s": samples}, ok


TURNS = 2  # per_step_cells: the libraries' loops take turns, the order reversed each turn


def per_step_cells(makes: list[Callable[[], Callable[..., Any]]], S: Any, runs: int, budget: float,
                   steps: int) -> list[tuple[str, float | None, Any]]:
    """(cell, seconds a step, last output) of each loop ``make()`` builds, called as ``loop(S)`` and timed per
    call, a call being `steps` steps; an exception becomes an error cell.

    Several loops (xlakern's and BrainEvent's for one product) are timed in turns, so that neither library is
    always timed first: each loop is built first; then ``TURNS`` turns, each timing every loop for about
    runs / TURNS calls and budget / TURNS seconds, the order reversed each turn; the figure is the median over
    all of a loop's samples. A single loop is timed in one turn. Timed one after the other, xlakern first, the
    4k gather read 0.87-1.08x BrainEvent's step, and level in rotating order (session 59)."""
    fns: list[Any] = []
    cells: list[Any] = [None] * len(makes)
    for i, make in enumerate(makes):
        try:
            fns.append(make())
        except Exception as e:  # noqa: BLE001
            fns.append(None)
            cells[i] = (err_cell(e), None, None)
    samples: list[list[float]] = [[] for _ in makes]
    outs: list[Any] = [None] * len(makes)
    turns = TURNS if len(makes) > 1 else 1
    for turn in range(turns):
        order = range(len(makes)) if turn % 2 == 0 else reversed(range(len(makes)))
        for i in order:
            if fns[i] is None:
                continue
            outs[i] = None  # released, as time_fn releases each call's output before the next
            try:
                _, got, outs[i] = time_fn(fns[i], (S,), max(1, runs // turns), budget=budget / turns,
                                          warmup=2 if turn == 0 else 1)
            except Exception as e:  # noqa: BLE001
                fns[i] = None
                cells[i] = (err_cell(e), None, None)
                continue
            samples[i] += got
    for i, got in enumerate(samples):
        if cells[i] is None:
            med = statistics.median(got) / steps
            cells[i] = (fmt_t(med), med, outs[i])
    return cells


def library_cells(make_xk: Callable[[], Callable[..., Any]], make_be: Callable[[], Callable[..., Any]] | None, S: Any,
                  runs: int, budget: float, steps: int, missing: str = NA_BE) -> tuple[tuple, tuple]:
    """per_step_cells of xlakern's loop and BrainEvent's, timed in turns; BrainEvent's is the cell ``missing``
    (with no time or output) where it is not installed or ``make_be`` is None."""
    if make_be is None or brainevent is None:
        return per_step_cells([make_xk], S, runs, budget, steps)[0], (missing, None, None)
    xk, be = per_step_cells([make_xk, make_be], S, runs, budget, steps)
    return xk, be


_LOADED: dict[str, Any] = {}


def loaded(key: str, fn: Callable[[], Any]) -> Any:
    """Build / load `key` once with fn(); a failure is remembered, so every cell using it reports the same error."""
    if key not in _LOADED:
        try:
            _LOADED[key] = fn()
        except Exception as e:  # noqa: BLE001
            _LOADED[key] = e
    r = _LOADED[key]
    if isinstance(r, Exception):
        raise r
    return r


def result_worker(script: str, args: list[str], env: dict[str, str], timeout: float) -> tuple[float, float]:
    """Run `script` in a fresh ``python -c`` process; its (seconds, max abs error), from the line it prints as
    ``RESULT <seconds> <error>``. A process that fails or prints none raises RuntimeError with its last line."""
    res = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")]
    if res.returncode != 0 or not lines:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"worker rc={res.returncode}: {tail[0]}")
    secs, err = lines[0].split()[1:]
    return float(secs), float(err)


def log(msg: str) -> None:
    """A progress line on stderr (stdout carries only the Markdown)."""
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------
# Machine description, section loop, epilogue
# --------------------------------------------------------------------------------------------


def machine_info(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """CPU, GPU, JAX devices and library versions; `extra` entries go after numpy's version."""
    cpu_model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    devs = jax.devices()
    gpus = [d for d in devs if d.platform == "gpu"]
    if devs[0].platform != "cpu":
        devs = devs + jax.devices("cpu")
    be_version = getattr(brainevent, "__version__", None) if brainevent else None
    import jaxlib

    return {
        "cpu_model": cpu_model,
        "cpu_cores": os.cpu_count(),
        "cpu_cores_usable": usable,
        "jax_devices": [f"{d.platform}:{d.device_kind}" for d in devs],
        "gpu": gpus[0].device_kind if gpus else None,
        "gpu_count": len(gpus),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "numpy": np.__version__,
        **(extra or {}),
        "xlakern": xlakern.__version__,
        "brainevent": be_version or BE_ERROR,
    }


def print_header(title: str, info: dict[str, Any], extra_versions: str = "") -> None:
    """Print the '## title' Markdown header and the machine lines from `info` (`extra_versions` ends the Python line)."""
    gpu_line = "none (JAX sees no GPU)"
    if info["gpu"]:
        gpu_line = info["gpu"] + (f" ×{info['gpu_count']}" if info["gpu_count"] > 1 else "")
    header = [
        f"## {title}",
        "",
        f"- CPU: {info['cpu_model']}, {info['cpu_cores']} cores ({info['cpu_cores_usable']} usable)",
        f"- GPU: {gpu_line}",
        f"- JAX devices (default backend first): {', '.join(info['jax_devices'])}",
        f"- Python {info['python']}, jax {info['jax']}, jaxlib {info['jaxlib']}, numpy {info['numpy']}"
        + extra_versions,
        f"- xlakern {info['xlakern']}, brainevent {info['brainevent']}",
        "",
    ]
    print("\n".join(header), flush=True)


def warm_gpu(seconds: float = 2.0) -> None:
    """Keep the GPU busy for `seconds` before the first timed cell, so that the first cells are not
    timed while its clocks are still rising (the first rows of earlier tables were slow for every library)."""
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError:
        return
    x = jax.device_put(jnp.ones((2048, 2048), jnp.float32), gpu)
    step = jax.jit(lambda a: jax.lax.fori_loop(0, 20, lambda i, b: (b @ a) * (1.0 / 2048), a))
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        x = jax.block_until_ready(step(x))


def run_sections(sections: Iterable[tuple[str, Callable[[], list[Table]]]]) -> list[Table]:
    """Run each (key, fn) section and print its tables; a section that raises becomes an error table."""
    tables: list[Table] = []
    for key, fn in sections:
        t0 = time.perf_counter()
        try:
            new = fn()
        except Exception as e:  # noqa: BLE001 -- a section that breaks outside its cells
            traceback.print_exc()
            err = Table(key, f"{key}. (section failed)", ["error"])
            err.add([err_cell(e)])
            new = [err]
        for t in new:
            print(t.markdown(), flush=True)
        tables += new
        log(f"section {key}: {time.perf_counter() - t0:.1f} s")
    return tables


def finish(t_start: float, info: dict[str, Any], tables: list[Table], json_path: str | None) -> None:
    """Print the total run time and, given `json_path`, write the machine info and tables there as JSON."""
    total = time.perf_counter() - t_start
    print(f"_Total run time: {total:.0f} s._", flush=True)
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps({"machine": info, "total_s": total,
                                               "tables": [t.as_json() for t in tables]}, indent=1))
        log(f"wrote {json_path}")
