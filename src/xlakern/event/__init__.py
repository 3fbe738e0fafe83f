"""Event-driven operators: spikes times stored connectivity, computed from the active spikes only.

A subpackage built on xlakern's public API alone: each operator is one
:class:`xlakern.XLACustomKernel` whose C++ and CUDA kernels ship as sources in ``kernels/`` and
are compiled by :func:`xlakern.load_cpp_file` / :func:`xlakern.load_cuda_file` on first use (then
served from xlakern's build cache); a pure-jnp backend is registered too. The names and keywords
are BrainEvent 0.3's, and xlakern re-exports them at top level.

Example::

    import jax.numpy as jnp, xlakern as brainevent
    W = brainevent.CSR.fromdense(np.random.rand(100, 50) * (np.random.rand(100, 50) < 0.1))
    current = brainevent.BinaryArray(spikes) @ W      # spikes: (100,) bool
"""

from ._errors import (
    EventArgumentError, EventBufferError, EventDependencyError, EventDTypeError, EventIndexError, EventMatmulError,
    EventNDimError, EventOperandError, EventRuleError, EventShapeError, EventTracedError, EventUnitError,
    IndexConversionError, UnsupportedOperationError,
)
from ._events import BinaryArray, BitPackedBinary, CompactBinary, EventRepresentation, WeightedArray, bitpack
from ._kernels import load_named_module as load_kernel_module  # xlakern.prepare_exported's, by module name
from ._kernels import (
    binary_csrmm_p, binary_csrmv_p, binary_densemm_p, binary_densemv_p, binary_fcnmm_p, binary_fcnmv_p, csrmm_p,
    csrmv_p, densemm_p, densemv_p, fcnmm_p, fcnmv_p,
)
from ._layouts import CSC, CSR, DataRepresentation, FixedNumConn, FixedNumPerPost, FixedNumPerPre
from ._dense_layout import Dense
from ._network import LIFParams, LIFState, lif_network_run_p, run_lif_network
from ._network_sharded import lif_shard_step_p, run_lif_network_sharded
from ._ops import (
    binary_csrmm, binary_csrmv, binary_densemm, binary_densemv, binary_fcnmm, binary_fcnmv, csrmm, csrmv, fcnmm,
    fcnmv,
)

# Names BrainEvent renamed: reachable with a DeprecationWarning, never in __all__.
DEPRECATED_RENAMES = {
    "EventArray": "BinaryArray",
    "FixedPostNumConn": "FixedNumPerPre",
    "FixedPreNumConn": "FixedNumPerPost",
}


def resolve_deprecated(name: str, namespace: dict, module: str):
    """The replacement of a renamed name (with a DeprecationWarning), else AttributeError."""
    import warnings

    if name in DEPRECATED_RENAMES:
        new = DEPRECATED_RENAMES[name]
        warnings.warn(f"{module}.{name} is deprecated; use {module}.{new} instead.", DeprecationWarning, stacklevel=3)
        return namespace[new]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


def __getattr__(name):
    return resolve_deprecated(name, globals(), __name__)


__all__ = [
    "EventRepresentation", "BinaryArray", "WeightedArray", "BitPackedBinary", "bitpack", "CompactBinary",
    "DataRepresentation", "CSR", "CSC", "FixedNumConn", "FixedNumPerPre", "FixedNumPerPost", "Dense",
    "binary_csrmv", "binary_csrmm", "csrmv", "csrmm", "binary_fcnmv", "binary_fcnmm", "fcnmv", "fcnmm",
    "binary_densemv", "binary_densemm",
    "binary_csrmv_p", "binary_csrmm_p", "csrmv_p", "csrmm_p", "binary_fcnmv_p", "binary_fcnmm_p", "fcnmv_p",
    "fcnmm_p", "binary_densemv_p", "binary_densemm_p", "densemv_p", "densemm_p",
    "EventShapeError", "EventIndexError", "EventMatmulError", "EventNDimError", "EventArgumentError", "EventTracedError",
    "EventDTypeError", "EventUnitError", "EventOperandError", "EventRuleError", "IndexConversionError", "EventDependencyError",
    "EventBufferError", "UnsupportedOperationError",
    # xlakern's own (not BrainEvent's): the fused LIF network simulator
    "LIFParams", "LIFState", "run_lif_network", "lif_network_run_p", "run_lif_network_sharded", "lif_shard_step_p",
]

# ----------------------------------------------------------------------------- part 2
# Just-in-time connectivity (matrices regenerated from a seed inside the kernels).
from ._jitc import (  # noqa: E402
    JITCMatrix, JITCNormalC, JITCNormalMatrix, JITCNormalR, JITCScalarC, JITCScalarMatrix, JITCScalarR, JITCUniformC,
    JITCUniformMatrix, JITCUniformR, binary_jitnmm, binary_jitnmv,
    binary_jitsmm, binary_jitsmv, binary_jitumm, binary_jitumv, jitn, jitnmm, jitnmv, jits, jitsmm, jitsmv, jitu,
    jitumm, jitumv,
)
from ._jitc_kernels import (  # noqa: E402
    binary_jitnmm_p, binary_jitnmv_p, binary_jitsmm_p, binary_jitsmv_p, binary_jitumm_p, binary_jitumv_p, jitn_p,
    jitnmm_p, jitnmv_p, jits_p, jitsmm_p, jitsmv_p, jitu_p, jitumm_p, jitumv_p,
)

DEPRECATED_RENAMES.update({"JITCHomoR": "JITCScalarR", "JITCHomoC": "JITCScalarC"})
__all__ += [
    "JITCMatrix", "JITCScalarMatrix", "JITCUniformMatrix", "JITCNormalMatrix",
    "JITCScalarR", "JITCScalarC", "JITCUniformR", "JITCUniformC", "JITCNormalR", "JITCNormalC",
    "jits", "jitsmv", "jitsmm", "binary_jitsmv", "binary_jitsmm", "jitu", "jitumv", "jitumm", "binary_jitumv",
    "binary_jitumm", "jitn", "jitnmv", "jitnmm", "binary_jitnmv", "binary_jitnmm",
    "jits_p", "jitsmv_p", "jitsmm_p", "binary_jitsmv_p", "binary_jitsmm_p", "jitu_p", "jitumv_p", "jitumm_p",
    "binary_jitumv_p", "binary_jitumm_p", "jitn_p", "jitnmv_p", "jitnmm_p", "binary_jitnmv_p", "binary_jitnmm_p",
]

# Plasticity: spike-triggered weight updates, in place.
from ._plasticity import (  # noqa: E402
    csc_to_csr_view, plasticity_update_p, update_csc_on_binary_post, update_csc_on_binary_pre,
    update_csr_on_binary_post, update_csr_on_binary_pre, update_dense_on_binary_post, update_dense_on_binary_pre,
    update_fixed_post_conn_on_binary_pre, update_fixed_pre_conn_on_binary_post,
)

DEPRECATED_RENAMES.update({
    "csr_on_pre": "update_csr_on_binary_pre", "csr2csc_on_post": "update_csr_on_binary_post",
    "dense_on_pre": "update_dense_on_binary_pre", "dense_on_post": "update_dense_on_binary_post",
})
__all__ += [
    "update_csr_on_binary_pre", "update_csr_on_binary_post", "update_csc_on_binary_pre", "update_csc_on_binary_post",
    "update_dense_on_binary_pre", "update_dense_on_binary_post", "update_fixed_post_conn_on_binary_pre",
    "update_fixed_pre_conn_on_binary_post", "csc_to_csr_view", "plasticity_update_p",
]

# Plasticity rules of one's own (any jnp function of a synapse's state and its neurons' values).
from ._plasticity_rules import csr_apply_on_post, csr_apply_on_pre  # noqa: E402

__all__ += ["csr_apply_on_pre", "csr_apply_on_post"]

# Synaptic delays: delivery into an arrival ring buffer.
from ._delay import CSRDelayLayout, csr_delay_deliver, csr_delay_deliver_layout, csr_delay_deliver_p  # noqa: E402

__all__ += ["CSRDelayLayout", "csr_delay_deliver", "csr_delay_deliver_layout", "csr_delay_deliver_p"]

# BrainEvent 0.3 has one primitive per plasticity function and per delay variant; xlakern runs each
# family through one XLACustomKernel, so those names are that kernel (for backend selection and
# introspection: it takes xlakern's operands, so call the functions above for BrainEvent's signatures).
update_csr_on_binary_pre_p = update_csr_on_binary_post_p = plasticity_update_p
update_dense_on_binary_pre_p = update_dense_on_binary_post_p = fcn_plasticity_row_p = plasticity_update_p
csr_delay_deliver_layout_p = csr_delay_deliver_p
__all__ += ["update_csr_on_binary_pre_p", "update_csr_on_binary_post_p", "update_dense_on_binary_pre_p",
            "update_dense_on_binary_post_p", "fcn_plasticity_row_p", "csr_delay_deliver_layout_p"]


# BrainEvent 0.3's per-synapse (dt2t) products, indexed CSR products, row slices and index conversions.
from ._dt2t import (  # noqa: E402
    cscmm_dt2t, cscmv_dt2t, csrmm_dt2t, csrmm_dt2t_p, csrmv_dt2t, csrmv_dt2t_p, fcnmm_dt2t, fcnmv_dt2t, jitnmv_dt2t,
    jitsmv_dt2t, jitumv_dt2t,
)
from ._csr_tools import (  # noqa: E402
    binary_csrmm_indexed, binary_csrmm_indexed_p, binary_csrmv_indexed, binary_csrmv_indexed_p, coo2csr,
    coo_to_csc_index, csc_to_csr_index, csr_slice_rows, csr_slice_rows_p, csr_to_coo_index, csr_to_csc_index,
)
from . import _csr_tools as _csr_tools_module, _dt2t as _dt2t_module  # noqa: E402

__all__ += [*_dt2t_module.__all__, *_csr_tools_module.__all__]

# BrainEvent 0.3's backend names, for code that passes backend= to an operator: its pure-JAX reference
# selects xlakern's (jnp), its CPU kernels (Numba) xlakern's C++ ones, and each of its GPU kernels (raw
# CUDA, Numba-CUDA, Pallas, Warp, cuSPARSE, TVM FFI) xlakern's one CUDA kernel of that operator; its
# cuBLAS dense products are XLA's own matrix product, which is jnp's.
BRAINEVENT_BACKENDS = {"jax_raw": "jnp", "numba": "cpp", "cuda_raw": "cuda", "numba_cuda": "cuda", "pallas": "cuda",
                       "warp": "cuda", "cusparse": "cuda", "tvmffi": "cuda", "cublas": "jnp"}


def _alias_brainevent_backends() -> None:
    from .._registry import get_primitives_by_tags

    for op in get_primitives_by_tags("event").values():
        for alias, backend in BRAINEVENT_BACKENDS.items():
            op.def_backend_alias(alias, backend)


_alias_brainevent_backends()
