"""The answer written down: ``best.yaml`` for ``trl <algo> --config``, ``best.json`` (the same, structured, with
what was measured), the engine files beside them, and the terminal's table."""

from autofit.export._files import write
from autofit.export._json import json_data
from autofit.export._table import table_text
from autofit.export._words import trades
from autofit.export._write import yaml_text

__all__ = ["json_data", "table_text", "trades", "write", "yaml_text"]
