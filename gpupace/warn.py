"""Warnings that point at the user's line: `warn(message)` walks past the frames of gpupace
and of contextlib (a paced site is a context manager around a generator), wherever in the
library it is called from, so that Python names the training script's line, not ours."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning] = RuntimeWarning) -> None:
    """`warnings.warn(message, category)` at the first caller outside gpupace."""
    warnings.warn(message, category, stacklevel=_caller_level())


def _caller_level() -> int:
    frame, level = sys._getframe(2), 2  # 1 is `warn` itself
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame, level = frame.f_back, level + 1
    return level
