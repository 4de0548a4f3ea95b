import os
import shutil

import pytest

# Never reach a model hub from tests; keep random-weight checkpoints out of the user's cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _autofit_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("autofit-cache")
    previous = os.environ.get("AUTOFIT_CACHE")
    os.environ["AUTOFIT_CACHE"] = str(cache)
    yield cache
    if previous is None:
        os.environ.pop("AUTOFIT_CACHE", None)
    else:
        os.environ["AUTOFIT_CACHE"] = previous
    shutil.rmtree(cache, ignore_errors=True)
