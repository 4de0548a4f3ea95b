"""``python -m autofit.cli``: the same as the ``autofit`` command."""

import sys

from autofit.cli._main import main

sys.exit(main())
