"""Gin at the edges: the one module that imports gin (scripts and tests use it; library code never).

Gin files live in the package's `gin/` folder (`specdec_t5x/gin/`, installed with the package;
the repository's `gin/` links to it) and use dynamic registration
(`from __gin__ import dynamic_registration`), so library functions and classes are configured
without decorators, as in T5X. Includes are relative to `gin/` (e.g.
`include 'gin/models/t5_1_1_base.gin'`; the package folder and `gin/` are both search paths:
`search_path()` is the one to give T5X's binaries as `--gin_search_paths`).
"""

from __future__ import annotations

import difflib
import pathlib
import re
from collections.abc import Sequence

import gin

# Shipped in the package (setup.py package_data); the repository's ./gin links here.
GIN_DIR = pathlib.Path(__file__).resolve().parent / "gin"


def search_path() -> str:
    """The folder to add to gin's search paths (T5X's `--gin_search_paths`) so that
    `include 'gin/...'` finds the shipped files: the installed package's folder."""
    return str(GIN_DIR.parent)


def parse(gin_files: Sequence[str], bindings: Sequence[str] = (), finalize: bool = True) -> None:
    """Parses gin files (paths, or names relative to `gin/`) and `KEY=VALUE` bindings.

    Args:
      gin_files: e.g. `['experiments/embedded_ende_model_t0.gin']`.
      bindings: e.g. `['GAMMA=5', "TASK='ddtp_ende'"]`, applied after the files.
      finalize: lock the config afterwards.

    Raises:
      FileNotFoundError: a gin file found neither as given nor under `gin/`.
      ValueError: a macro is still `%gin.REQUIRED` after parsing (the message names it), or a
        binding sets a macro nothing references (e.g. a mistyped `GAMA=3`; gin itself accepts
        it silently and the run would go on with the default).
    """
    gin.add_config_file_search_path(str(GIN_DIR.parent))
    gin.add_config_file_search_path(str(GIN_DIR))
    resolved = []
    for name in gin_files:
        path = pathlib.Path(name)
        for root in (GIN_DIR.parent, GIN_DIR):
            if not path.exists() and (root / name).exists():
                path = root / name
        if not path.exists():
            raise FileNotFoundError(f"gin file {name!r} not found (also looked in {GIN_DIR}).")
        resolved.append(str(path))
    gin.parse_config_files_and_bindings(resolved, list(bindings), finalize_config=False)
    missing = missing_required_macros()
    if missing:
        hint = (
            " DRAFT comes from a draft file: include one of gin/models/draft_*.gin or "
            "gin/models/embedded_*_draft*.gin (before or after gin/decoding/speculative.gin)."
            if "DRAFT" in missing
            else ""
        )
        raise ValueError(
            "required gin macro(s) not set: "
            + ", ".join(missing)
            + " (set them in a gin file or with --gin.NAME=VALUE, e.g. "
            + f"--gin.{missing[0]}=...)."
            + hint
        )
    unused = unused_macros(bindings)
    if unused:
        known = [name for name in defined_macros() if name not in unused]
        hints = [
            f"{name} (did you mean {', '.join(difflib.get_close_matches(name, known, n=2))}?)"
            if difflib.get_close_matches(name, known, n=1)
            else name
            for name in unused
        ]
        raise ValueError(
            "binding(s) set gin macro(s) that nothing in the config uses: "
            + "; ".join(hints)
            + f". Macros of this config: {', '.join(known)}."
        )
    if finalize:
        gin.finalize()


def _macro_name(binding: str) -> str | None:
    """'GAMMA = 5' -> 'GAMMA'; None for a parameter binding ('a.b = 1', 'scope/a.b = 1')."""
    match = re.match(r"\s*([A-Za-z_]\w*)\s*=", binding)
    return match.group(1) if match else None


def defined_macros() -> list[str]:
    """Names of the macros defined in the parsed config."""
    return sorted(set(re.findall(r"^(\w+) = ", gin.config_str(), re.MULTILINE)))


def unused_macros(bindings: Sequence[str]) -> list[str]:
    """Macros set by `bindings` that no binding or macro of the parsed config references."""
    text = gin.config_str()
    names = [name for name in map(_macro_name, bindings) if name]
    return [name for name in names if not re.search(rf"%{name}\b", text)]


def missing_required_macros() -> list[str]:
    """Names of macros still bound to `%gin.REQUIRED`, or referenced and never set, in the
    parsed config (e.g. DRAFT when no draft file is included)."""
    text = gin.config_str()
    pattern = re.compile(r"^(\w+) = %gin\.REQUIRED$", re.MULTILINE)
    referenced = set(re.findall(r"%(\w+)\b", text)) - {"gin"}
    return sorted(set(pattern.findall(text)) | (referenced - set(defined_macros())))


def reject_bindings(parameters: Sequence[str], route: str) -> None:
    """Raises if the parsed config binds any of `parameters`, which the run sets itself.

    Gin applies a binding only when the caller leaves the argument out; a run that passes an
    argument per call silently overrides the binding. Such bindings are errors, not no-ops.

    Args:
      parameters: 'module.function.parameter' selectors the run passes per call, e.g.
        'speculative.speculative_sample.gamma'.
      route: what to set instead, for the message (e.g. 'the GAMMA macro').

    Raises:
      ValueError: naming each bound parameter and its value.
    """
    bound = []
    for selector in parameters:
        try:
            bound.append(f"{selector} = {gin.query_parameter(selector)!r}")
        except ValueError:  # not bound (or its module is not in this config)
            continue
    if bound:
        raise ValueError(
            f"gin binds {'; '.join(bound)}, but this run passes these per call, so the binding(s) "
            f"would be ignored: set {route} instead."
        )


@gin.configurable(module="gin_utils")
def build(obj=gin.REQUIRED):
    """Returns what gin binds to `obj` (`gin_utils.build.obj = %MODEL` builds the model)."""
    return obj


def operative_config() -> str:
    """The operative gin config (what was actually used), to save next to results."""
    return gin.operative_config_str()


def query_macro(name: str, default=None):
    """The value of macro `name` in the parsed config, or `default` when it is not defined."""
    if name not in defined_macros():
        return default
    return gin.query_parameter(f"%{name}")
