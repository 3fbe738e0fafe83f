"""Entry points: arg_spec tokens, ``// @xk`` annotations and C++ signatures.

An entry point is a ``void`` C++ function whose parameters are, in order, the
tokens of its arg_spec::

    // @xk scale arg ret attr.factor:float32 stream
    void scale(const xk::Tensor x, xk::Tensor out, float factor, int64_t stream);

Everything here runs before any compiler does, so a malformed spec fails fast
with the function, the token and the source line in the message.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

# attr type -> C++ type the handler decodes (16-bit floats travel as their raw bits: uint16_t).
from ._dtypes import ATTR_CPP_TYPES as ATTR_TYPES
from .errors import SpecError, XlakernError

# C++ scalar spelling -> attr type it is inferred as (LP64: long is 64-bit).
_CPP_SCALARS: dict[str, str] = {
    "bool": "bool",
    "int8_t": "int8", "signed char": "int8",
    "int16_t": "int16", "short": "int16", "short int": "int16",
    "int32_t": "int32", "int": "int32", "signed": "int32", "signed int": "int32",
    "int64_t": "int64", "long": "int64", "long int": "int64", "long long": "int64",
    "long long int": "int64", "ptrdiff_t": "int64", "intptr_t": "int64",
    "uint8_t": "uint8", "unsigned char": "uint8",
    "uint16_t": "uint16", "unsigned short": "uint16", "unsigned short int": "uint16",
    "uint32_t": "uint32", "unsigned": "uint32", "unsigned int": "uint32",
    "uint64_t": "uint64", "unsigned long": "uint64", "unsigned long int": "uint64",
    "unsigned long long": "uint64", "unsigned long long int": "uint64",
    "size_t": "uint64", "uintptr_t": "uint64",
    "float": "float32",
    "double": "float64",
}

_TENSOR_RE = re.compile(r"^(?:::)?(?:(?:xk|BE)\s*::\s*)?Tensor$")
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ANNOTATION_RE = re.compile(r"^[ \t]*//[ \t]*@(?:xk|BE)\b(.*)$", re.MULTILINE)

VALID_TOKENS = "arg, ret, stream, attr.NAME, attr.NAME:TYPE (aliases: args, rets, ctx.stream, attrs.NAME)"


@dataclasses.dataclass(frozen=True)
class Source:
    """One unit of user code: inline text (written to the build dir) or a file compiled in place."""

    label: str  # what diagnostics call it: 'inline:name' or the file's path
    text: str  # for scanning: files are decoded leniently, so a stray Latin-1 byte is harmless
    path: Path | None = None  # set for files
    data: bytes | None = None  # the exact bytes compiled and hashed; None: ``text`` as UTF-8

    def __post_init__(self) -> None:
        if self.data is None:
            object.__setattr__(self, "data", self.text.encode("utf-8", errors="surrogatepass"))

    @classmethod
    def from_file(cls, path: Path) -> "Source":
        """The file's bytes, as the compiler will read them (any encoding)."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise XlakernError(f"cannot read source file {path}: {e.strerror or e}; check it exists and "
                               f"is readable") from None
        return cls(str(path), data.decode("utf-8", errors="replace"), Path(path), data)


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an entry point, classified."""

    kind: str  # "arg" | "ret" | "attr" | "stream"
    cpp_type: str  # type as the generated declaration spells it
    cpp_name: str
    attr_name: str | None = None
    attr_type: str | None = None  # key of ATTR_TYPES

    @property
    def token(self) -> str:
        if self.kind == "attr":
            return f"attr.{self.attr_name}:{self.attr_type}"
        return self.kind


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    name: str
    params: tuple[Param, ...]
    source: str
    line: int
    c_linkage: bool = False
    namespace: tuple[str, ...] = ()  # enclosing C++ namespaces, outermost first

    @property
    def qualified_name(self) -> str:
        """How the generated handler names the function: ``::ns::inner::fn``."""
        return "::" + "::".join((*self.namespace, self.name))

    @property
    def spec(self) -> str:
        """The canonical arg_spec, every attr typed: ``"arg ret attr.k:float32 stream"``."""
        return " ".join(p.token for p in self.params)

    @property
    def args(self) -> list[Param]:
        return [p for p in self.params if p.kind == "arg"]

    @property
    def rets(self) -> list[Param]:
        return [p for p in self.params if p.kind == "ret"]

    @property
    def attrs(self) -> list[Param]:
        return [p for p in self.params if p.kind == "attr"]

    @property
    def has_stream(self) -> bool:
        return any(p.kind == "stream" for p in self.params)


# ---------------------------------------------------------------------------
# C++ scanning


def blank_comments_and_strings(text: str) -> str:
    """Return ``text`` with comments and string/char literals replaced by spaces.

    Newlines are kept, so offsets and line numbers stay those of the original.
    """
    out = list(text)
    i, n = 0, len(text)

    def blank(a: int, b: int) -> None:
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^()\\ ]{0,16})\(', text[i:])
            if not m:
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            blank(i + 1, j)
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i + 1, min(j, n))
            i = j + 1
        else:
            i += 1
    return "".join(out)


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _matching_paren(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                return k
    return -1


def _split_params(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "<([{":
            depth += 1
        elif ch in ">)]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    parts = [" ".join(p.split()) for p in parts]
    if parts == [""] or parts == ["void"]:
        return []
    return parts


@dataclasses.dataclass(frozen=True)
class CppParam:
    text: str
    type_text: str  # without the name and without default value
    name: str
    is_const: bool
    is_ref: bool
    base: str  # type with const, & and std:: removed


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    params: tuple[CppParam, ...]
    source: Source
    line: int
    c_linkage: bool = False  # declared extern "C"
    namespace: tuple[str, ...] = ()


def _parse_cpp_param(text: str) -> CppParam:
    t = text.split("=")[0].strip()
    name = ""
    m = re.match(r"^(.*?[\s*&])([A-Za-z_][A-Za-z0-9_]*)$", t)
    if m and m.group(1).strip() and m.group(1).strip() not in ("const", "unsigned", "signed", "long", "short"):
        type_text, name = m.group(1).strip(), m.group(2)
        # "unsigned int" style types without a name: 'int' is not a name.
        if name in ("int", "char", "long", "short", "double", "float", "bool"):
            type_text, name = t, ""
    else:
        type_text = t
    is_ref = "&" in type_text
    words = type_text.replace("&", " ").replace("*", " * ").split()
    is_const = "const" in words
    base_words = [w for w in words if w not in ("const", "volatile")]
    base = " ".join(base_words)
    base = re.sub(r"^(?:::)?std\s*::\s*", "", base)
    base = re.sub(r"\s*::\s*", "::", base)
    return CppParam(text=text, type_text=type_text, name=name, is_const=is_const, is_ref=is_ref, base=base)


_NAMESPACE_RE = re.compile(r"\bnamespace\s*(?:\[\[[^\]]*\]\]\s*)?((?:[A-Za-z_]\w*\s*(?:::\s*)?)*)$")
_EXTERN_C_RE = re.compile(r'\bextern\s*"\s*"\s*$')  # literal text is blanked, quotes stay


def _scope_of(clean: str, offset: int) -> list[tuple[str, tuple[str, ...]]]:
    """The braces enclosing ``offset``, outermost first: ("namespace", names) (names empty for an
    anonymous namespace), ("extern_c", ()) or ("other", ()) for classes, functions, initialisers."""
    stack: list[tuple[str, tuple[str, ...]]] = []
    for m in re.finditer(r"[{}]", clean[:offset]):
        if m.group() == "}":
            if stack:
                stack.pop()
            continue
        start = max(clean.rfind(c, 0, m.start()) for c in ";{}")
        head = " ".join(clean[start + 1:m.start()].split())
        ns = _NAMESPACE_RE.search(head)
        if ns:
            stack.append(("namespace", tuple(n.strip() for n in ns.group(1).split("::") if n.strip())))
        elif _EXTERN_C_RE.search(head):
            stack.append(("extern_c", ()))
        else:
            stack.append(("other", ()))
    return stack


def find_signature(sources: Sequence[Source], name: str, cleaned: Sequence[str]) -> Signature | None:
    """Locate the definition (or failing that, a declaration) of ``void name(...)``.

    Functions in namespaces are found with their namespace; class members and functions in an
    anonymous namespace cannot be called from the generated handlers and are refused.
    """
    found: list[tuple[int, Signature]] = []
    members: list[tuple[Source, int]] = []
    for src, clean in zip(sources, cleaned):
        for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", clean):
            close = _matching_paren(clean, m.end() - 1)
            if close < 0:
                continue
            after = clean[close + 1:].lstrip()
            after = re.sub(r"^(?:noexcept|throw\s*\(\s*\))\s*", "", after)
            if not after or after[0] not in "{;":
                continue  # a call, not a definition or declaration
            start = max(clean.rfind(c, 0, m.start()) for c in ";{}")
            directive = clean.rfind("#", 0, m.start())
            if directive > start:  # a preprocessor line ends at its newline, not at a ';'
                start = max(start, clean.find("\n", directive))
            prefix = " ".join(clean[start + 1:m.start()].split())
            if re.search(r"[=(,]|\breturn\b", prefix):
                continue
            line = _line_of(clean, m.start())
            # 'void ns::fn(...) {' defines a function of namespace ns out of line.
            qualifier = re.search(r"((?:[A-Za-z_]\w*\s*::\s*)+)$", prefix)
            if qualifier:
                prefix = prefix[:qualifier.start()].rstrip()
            scope = _scope_of(clean, m.start())
            if any(kind == "other" for kind, _ in scope):
                members.append((src, line))
                continue
            if any(kind == "namespace" and not names for kind, names in scope):
                raise SpecError(
                    f"entry point '{name}' ({src.label}, line {line}) is in an anonymous namespace, so the "
                    f"generated FFI handler cannot call it; move it into a named namespace or out of it")
            namespace = tuple(n for kind, names in scope if kind == "namespace" for n in names)
            if qualifier:
                namespace += tuple(n.strip() for n in qualifier.group(1).split("::") if n.strip())
            if not re.search(r"\bvoid$", prefix):
                raise SpecError(
                    f"entry point '{name}' ({src.label}, line {line}) must return void "
                    f"(found '{prefix} {name}(...)'); write the outputs into its non-const Tensor parameters"
                )
            if re.search(r"\bstatic\b", prefix):
                raise SpecError(
                    f"entry point '{name}' ({src.label}, line {line}) is declared static, so the generated "
                    f"FFI handler cannot call it; remove 'static'"
                )
            params = tuple(_parse_cpp_param(p) for p in _split_params(clean[m.end():close]))
            rank = 0 if after[0] == "{" else 1
            c_linkage = bool(re.search(r'\bextern\s*"', prefix)) or any(k == "extern_c" for k, _ in scope)
            found.append((rank, Signature(name, params, src, line, c_linkage, namespace)))
    if not found:
        if members:
            src, line = members[0]
            raise SpecError(
                f"entry point '{name}' ({src.label}, line {line}) is a class member (or local to a block); "
                f"entry points must be free functions at namespace scope")
        return None
    namespaces = sorted({"::".join(sig.namespace) or "(global)" for _, sig in found})
    if len(namespaces) > 1:
        raise SpecError(
            f"entry point '{name}' is defined in several namespaces ({', '.join(namespaces)}); one module "
            f"exports one function per name, so rename all but one")
    found.sort(key=lambda item: item[0])
    return found[0][1]


def find_annotations(sources: Sequence[Source]) -> list[tuple[str, list[str] | None, Source, int]]:
    """All ``// @xk name tokens...`` (or ``// @BE``) annotations, in source order."""
    result = []
    for src in sources:
        for m in _ANNOTATION_RE.finditer(src.text):
            words = m.group(1).split()
            line = _line_of(src.text, m.start())
            if not words:
                raise SpecError(f"{src.label}, line {line}: annotation names no function; write '// @xk fn_name tokens...'")
            name = words[0]
            if not _IDENT_RE.match(name):
                raise SpecError(f"{src.label}, line {line}: '{name}' in the annotation is not a C++ function name")
            result.append((name, words[1:] or None, src, line))
    return result


# ---------------------------------------------------------------------------
# tokens and signatures -> entry points


def _classify(p: CppParam) -> tuple[str, str | None]:
    """What a C++ parameter can bind to: ('tensor_in'|'tensor_out'|'scalar'|'stream'|'unknown', attr type)."""
    base_words = p.base.split()
    base = " ".join(base_words)
    if _TENSOR_RE.match(base.replace(" ", "")):
        if p.is_const:
            return "tensor_in", None
        return "tensor_out", None
    if base == "cudaStream_t":
        return "stream", None
    if base in _CPP_SCALARS and not p.is_ref:
        return "scalar", _CPP_SCALARS[base]
    return "unknown", None


def _declaration_type(p: CppParam, kind: str) -> str:
    if kind in ("tensor_in", "tensor_out"):
        return ("const " if p.is_const else "") + "::xk::Tensor" + ("&" if p.is_ref else "")
    return p.type_text


def _where(sig: Signature) -> str:
    return f"entry point '{sig.name}' ({sig.source.label}, line {sig.line})"


def parse_tokens(tokens: Iterable[str], where: str) -> list[tuple[str, str | None, str | None]]:
    """Parse arg_spec tokens into (kind, attr name, attr type or None)."""
    parsed = []
    for tok in tokens:
        if not isinstance(tok, str):
            raise SpecError(f"{where}: token {tok!r:.40} is a {type(tok).__name__}; tokens are strings such as "
                            f"'arg', 'ret' or 'attr.alpha:float32'")
        t = tok.strip()
        if t in ("arg", "args"):
            parsed.append(("arg", None, None))
        elif t in ("ret", "rets"):
            parsed.append(("ret", None, None))
        elif t in ("stream", "ctx.stream"):
            parsed.append(("stream", None, None))
        elif t.startswith(("attr.", "attrs.")):
            body = t.split(".", 1)[1]
            name, _, typ = body.partition(":")
            if not _IDENT_RE.match(name):
                raise SpecError(f"{where}: token '{t}': '{name}' is not a valid attribute name")
            if typ and typ not in ATTR_TYPES:
                raise SpecError(
                    f"{where}: token '{t}': unknown attr type '{typ}'; supported: {', '.join(ATTR_TYPES)}"
                )
            parsed.append(("attr", name, typ or None))
        else:
            raise SpecError(f"{where}: unknown token '{t}'; valid tokens: {VALID_TOKENS}")
    return parsed


def normalize_tokens(tokens: Iterable[str]) -> list[str]:
    """arg_spec tokens in their canonical spelling: ``args`` -> ``arg``, ``rets`` -> ``ret``,
    ``ctx.stream`` -> ``stream``, ``attrs.NAME[:TYPE]`` -> ``attr.NAME[:TYPE]``; others unchanged.
    A token that is none of these raises :class:`SpecError`.

    Example::

        xlakern.normalize_tokens(["args", "rets", "attrs.alpha:float32", "ctx.stream"])
        # ['arg', 'ret', 'attr.alpha:float32', 'stream']
    """
    if isinstance(tokens, str) or not isinstance(tokens, Iterable):
        hint = f"; for a spec written as one string pass {tokens!r:.40}.split()" if isinstance(tokens, str) else ""
        raise SpecError(f"normalize_tokens: tokens must be a list of token strings; got {type(tokens).__name__}{hint}")
    tokens = list(tokens)
    out = []
    for (kind, name, typ) in parse_tokens(tokens, "normalize_tokens"):
        out.append(kind if kind != "attr" else f"attr.{name}" + (f":{typ}" if typ else ""))
    return out


def infer_tokens(sig: Signature) -> list[str]:
    """The arg_spec implied by a C++ signature."""
    tokens = []
    for p in sig.params:
        kind, attr_type = _classify(p)
        if kind == "tensor_in":
            tokens.append("arg")
        elif kind == "tensor_out":
            tokens.append("ret")
        elif kind == "stream" or (kind == "scalar" and p.name == "stream" and attr_type == "int64"):
            tokens.append("stream")
        elif kind == "scalar":
            if not p.name:
                raise SpecError(f"{_where(sig)}: parameter '{p.text}' needs a name to become an attribute")
            tokens.append(f"attr.{p.name}:{attr_type}")
        else:
            raise SpecError(
                f"{_where(sig)}: cannot infer a token for parameter '{p.text}': expected "
                f"'const xk::Tensor' (input), 'xk::Tensor' (output), a scalar type "
                f"({', '.join(sorted(set(_CPP_SCALARS.values())))}) or 'int64_t stream'"
            )
    return tokens


def bind(sig: Signature, tokens: Sequence[str], *, platform: str) -> EntryPoint:
    """Check ``tokens`` against ``sig`` and build the entry point."""
    where = _where(sig)
    parsed = parse_tokens(tokens, where)
    if len(parsed) != len(sig.params):
        raise SpecError(
            f"{where}: the arg_spec has {len(parsed)} token(s) ({' '.join(tokens) or 'none'}) but the C++ "
            f"function has {len(sig.params)} parameter(s) ({', '.join(p.text for p in sig.params) or 'none'}); "
            f"give one token per parameter, in order"
        )
    params: list[Param] = []
    seen_attrs: set[str] = set()
    for (kind, attr_name, attr_type), p, tok in zip(parsed, sig.params, tokens):
        ckind, cattr = _classify(p)
        bad = f"{where}: token '{tok}' does not fit parameter '{p.text}'"
        if kind == "arg":
            if ckind != "tensor_in":
                raise SpecError(f"{bad}: an input ('arg') must be declared 'const xk::Tensor' (or 'const BE::Tensor')")
        elif kind == "ret":
            if ckind != "tensor_out":
                raise SpecError(f"{bad}: an output ('ret') must be a non-const 'xk::Tensor' (or 'BE::Tensor')")
        elif kind == "stream":
            if platform != "cuda":
                raise SpecError(
                    f"{where}: token '{tok}': a CPU module has no CUDA stream; drop the token and the "
                    f"parameter, or build it with load_cuda_inline/load_cuda_file"
                )
            if not (ckind == "stream" or (ckind == "scalar" and cattr == "int64")):
                raise SpecError(f"{bad}: the stream parameter must be 'int64_t' or 'cudaStream_t'")
        else:  # attr
            if ckind != "scalar":
                raise SpecError(
                    f"{bad}: an attribute must be a scalar parameter (bool, intN_t, uintN_t, float, double)"
                )
            if attr_type is None:
                attr_type = cattr
            expected_cpp = ATTR_TYPES[attr_type]
            if _CPP_SCALARS.get(expected_cpp) != cattr:
                raise SpecError(
                    f"{bad}: attr type '{attr_type}' is passed as C++ '{expected_cpp}', but the parameter "
                    f"is '{p.base}'"
                )
            if attr_name in seen_attrs:
                raise SpecError(f"{where}: attribute '{attr_name}' appears twice in the arg_spec")
            seen_attrs.add(attr_name)
        decl = _declaration_type(p, ckind)
        params.append(Param(kind=kind, cpp_type=decl, cpp_name=p.name, attr_name=attr_name, attr_type=attr_type))
    entry = EntryPoint(name=sig.name, params=tuple(params), source=sig.source.label, line=sig.line,
                       c_linkage=sig.c_linkage, namespace=sig.namespace)
    if sum(p.kind == "stream" for p in params) > 1:
        raise SpecError(f"{where}: more than one 'stream' token")
    if not entry.rets:
        raise SpecError(
            f"{where}: the function has no output: every Tensor parameter is const (or there is none). "
            f"Declare outputs as non-const 'xk::Tensor' and mark them 'ret'"
        )
    if platform == "cuda" and not entry.has_stream:
        raise SpecError(
            f"{where}: a CUDA entry point must take XLA's stream ('int64_t stream', token 'stream') "
            f"and launch its kernels on it; the default stream would break ordering and CUDA graphs"
        )
    return entry


def resolve_entry_points(
    sources: Sequence[Source],
    functions: Mapping[str, object] | Sequence[str] | None,
    *,
    platform: str,
) -> list[EntryPoint]:
    """Turn the ``functions=`` argument (or the annotations) into checked entry points."""
    cleaned = [blank_comments_and_strings(s.text) for s in sources]
    annotations = find_annotations(sources)
    by_name: dict[str, tuple[list[str] | None, Source, int]] = {}
    for name, toks, src, line in annotations:
        if name in by_name:
            prev = by_name[name]
            raise SpecError(
                f"'{name}' is annotated twice ({prev[1].label}, line {prev[2]} and {src.label}, line {line}); keep one"
            )
        by_name[name] = (toks, src, line)

    requested: list[tuple[str, list[str] | None]]
    if functions is None:
        if not by_name:
            raise SpecError(
                "no entry points found: annotate each one with '// @xk fn_name tokens...' on the line before "
                "it, or pass functions=['fn', ...] or functions={'fn': 'arg ret'}"
            )
        requested = [(name, toks) for name, (toks, _, _) in by_name.items()]
    elif isinstance(functions, Mapping):
        requested = []
        for name, toks in functions.items():
            if toks is None or (isinstance(toks, str) and not toks.strip()):
                requested.append((name, None))
            elif isinstance(toks, str):
                requested.append((name, toks.split()))
            elif isinstance(toks, (list, tuple)) and all(isinstance(t, str) for t in toks):
                requested.append((name, list(toks)))
            else:
                raise SpecError(
                    f"functions['{name}'] must be a token string like 'arg ret attr.k:float32', a list of "
                    f"tokens, or None to infer it; got {toks!r}"
                )
    elif isinstance(functions, (list, tuple)) and all(isinstance(f, str) for f in functions):
        requested = [(name, by_name.get(name, (None,))[0]) for name in functions]
    else:
        raise SpecError(
            f"functions= must be None, a list of function names, or a dict {{name: tokens}}; got {functions!r}"
        )

    entries = []
    seen = set()
    for name, toks in requested:
        if not _IDENT_RE.match(name):
            raise SpecError(f"'{name}' is not a valid C++ function name")
        if name in seen:
            raise SpecError(f"entry point '{name}' is listed twice")
        seen.add(name)
        sig = find_signature(sources, name, cleaned)
        if sig is None:
            where = ""
            if name in by_name:
                where = f" (annotated at {by_name[name][1].label}, line {by_name[name][2]})"
            raise SpecError(
                f"entry point '{name}'{where} is not defined in the sources; define "
                f"'void {name}(...)' at namespace scope, or fix the name"
            )
        if toks is None:
            toks = infer_tokens(sig)
        entries.append(bind(sig, toks, platform=platform))
    return entries
