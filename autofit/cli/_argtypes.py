"""Argument types shared by the command-line parsers (``autofit search``, ``autofit estimate``)."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not valid: a positive integer is accepted")
    return value


def verify_steps(text: str):
    """A positive integer, or "auto"."""
    if text == "auto":
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'{text}' is not valid: a positive integer or 'auto' is accepted") from None


def gpus(text: str):
    """A positive number of GPUs, or "all"."""
    if text.strip().lower() == "all":
        return "all"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"'{text}' is not valid: a positive number of GPUs or 'all' is accepted") \
            from None
