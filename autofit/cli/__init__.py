"""The command line, ``autofit search | estimate | report``. Exit codes: 0 a fitting config was written, 2 bad input
(the user's trainer factory failing included), 3 nothing fits, 4 probes cannot run here, 130 interrupted."""

from autofit.cli._main import (
    EXIT_BAD_INPUT,
    EXIT_CODES,
    EXIT_NO_FIT,
    EXIT_OK,
    EXIT_PROBES_CANNOT_RUN,
    build_parser,
    main,
)

__all__ = ["EXIT_BAD_INPUT", "EXIT_CODES", "EXIT_NO_FIT", "EXIT_OK", "EXIT_PROBES_CANNOT_RUN", "build_parser", "main"]
