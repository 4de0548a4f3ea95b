"""A failed probe said for the user: the error in one line, and the frames of their own code in its traceback (runs
in the probe process; ``classify_exception`` in ``autofit.probe._classify`` says what the failure is)."""

from __future__ import annotations

import traceback

from autofit.probe._classify import user_file


def one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


def user_frames(exc: BaseException) -> str:
    """The traceback frames of the user's own code (not of the libraries it called), innermost last."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__)
              if user_file(frame.filename)]
    return "".join(traceback.format_list(frames[-6:])).rstrip()
