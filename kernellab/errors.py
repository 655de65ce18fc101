"""Exceptions kernellab raises: each says what happened, what was expected and how to fix it."""
from __future__ import annotations

from dataclasses import dataclass


class KernellabError(Exception):
    """Base class of every error kernellab raises on purpose."""

    def _render_traceback_(self) -> list[str]:
        """In IPython: the message alone. It says what happened and how to fix it; kernellab's frames add nothing."""
        return [f"\x1b[31m{type(self).__name__}\x1b[0m: {line}" if i == 0 else line
                for i, line in enumerate(str(self).splitlines() or [""])]


@dataclass(frozen=True)
class Diagnostic:
    """One compiler message, located in the source as the user numbers it."""

    line: int | None
    column: int | None
    severity: str  # "error", "warning", "remark" or "catastrophic error"
    message: str
    code: str | None = None  # e.g. "177-D"

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line else "?"
        if self.line and self.column:
            where += f", column {self.column}"
        return f"{where}: {self.severity}: {self.message}"


def render_source_excerpt(source: str, line: int | None, column: int | None, first_line: int = 1,
                          context: int = 1) -> str:
    """Source lines around `line` (numbered from `first_line`), with a caret under `column`."""
    if not line:
        return ""
    lines = source.splitlines()
    idx = line - first_line
    if idx < 0 or idx >= len(lines):
        return ""
    out = []
    width = len(str(line + context))
    for i in range(max(0, idx - context), min(len(lines), idx + context + 1)):
        mark = ">" if i == idx else " "
        out.append(f" {mark}{i + first_line:>{width}} | {lines[i]}")
        if i == idx and column:
            out.append(" " * (width + 5) + " " * (column - 1) + "^")
    return "\n".join(out)


class CompileError(KernellabError):
    """The compiler rejected the source; `.diagnostics` locates each problem."""

    def __init__(self, diagnostics, log: str, source: str, options=(), first_line: int = 1,
                 filename: str = "<cuda>", hint: str | None = None):
        self.diagnostics = tuple(diagnostics)
        self.hint = hint            # what to do about it, when kernellab knows (e.g. compile for sm_90a)
        self.log = log
        self.source = source
        self.options = tuple(options)
        self.first_line = first_line
        self.filename = filename
        super().__init__(self._message())

    @property
    def errors(self):
        return tuple(d for d in self.diagnostics if d.severity.endswith("error"))

    @property
    def warnings(self):
        return tuple(d for d in self.diagnostics if d.severity == "warning")

    def _message(self) -> str:
        errs = self.errors
        head = f"compilation failed with {len(errs)} error{'s' if len(errs) != 1 else ''}"
        if self.warnings:
            head += f" and {len(self.warnings)} warning{'s' if len(self.warnings) != 1 else ''}"
        parts = [head]
        for d in self.diagnostics:
            parts.append(f"{self.filename}:{d}")
            excerpt = render_source_excerpt(self.source, d.line, d.column, self.first_line)
            if excerpt:
                parts.append(excerpt)
        if not self.diagnostics:
            parts.append(self.log.strip())
        if self.hint:
            parts.append(f"hint: {self.hint}")
        return "\n".join(parts)

    def to_json(self) -> dict:
        errs, warns = len(self.errors), len(self.warnings)
        title = f"{self.filename}: {errs} error{'s' if errs != 1 else ''}"
        if warns:
            title += f", {warns} warning{'s' if warns != 1 else ''}"
        return {"kind": "compile", "version": 1, "title": title, "ok": False,
                "diagnostics": [{"line": d.line, "column": d.column, "severity": d.severity,
                                 "message": d.message} for d in self.diagnostics],
                "log": self.log, "kernels": [], "notes": [self.hint] if self.hint else []}


class NoGPUError(KernellabError):
    """A GPU was needed (to launch or time a kernel) and none is usable here."""


class ArgumentError(KernellabError, TypeError):
    """A kernel argument (or the launch configuration) does not fit the kernel's signature or the device."""


class LaunchError(KernellabError):
    """The launch failed or the kernel faulted on the device."""

    def __init__(self, message: str, *, sticky: bool = False, cuda_error: str | None = None, job=None):
        self.sticky = sticky
        self.cuda_error = cuda_error
        self.job = job
        super().__init__(message)
