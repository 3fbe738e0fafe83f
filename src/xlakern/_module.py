"""The old home of the loaders and module classes, kept so that ``xlakern._module.X`` still works.

Load time (loaders, build orchestration, registration) is in :mod:`xlakern._loading`; call time
(``CompiledModule``, ``CompiledFunction``, attribute coercion, call checks) in :mod:`xlakern._calling`.

Example::

    from xlakern._module import load_cpp_inline      # the same function as xlakern.load_cpp_inline
"""

from . import _build  # noqa: F401  (reached as xlakern._module._build)
from ._calling import *  # noqa: F401,F403
from ._calling import _MAX_DIMS, SUPPORTED_DTYPES  # noqa: F401
from ._loading import *  # noqa: F401,F403
from ._loading import MAX_NAME_LENGTH  # noqa: F401
