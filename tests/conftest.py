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


@pytest.fixture(scope="session", autouse=True)
def _queue_key(tmp_path_factory):
    """The workers' queue key of the tests' own (never the user's ~/.config/autofit/queue.key): a search with
    --workers creates it where missing, and every worker process the tests start reads the same one."""
    key = tmp_path_factory.mktemp("autofit-config") / "queue.key"
    previous = os.environ.get("AUTOFIT_QUEUE_KEY_FILE")
    os.environ["AUTOFIT_QUEUE_KEY_FILE"] = str(key)
    yield key
    if previous is None:
        os.environ.pop("AUTOFIT_QUEUE_KEY_FILE", None)
    else:
        os.environ["AUTOFIT_QUEUE_KEY_FILE"] = previous


@pytest.fixture(autouse=True)
def _environment_as_found():
    """Each test leaves the process environment as it found it. A probe run in the test's own process sets its
    launch's variables as a probe's child does (``ACCELERATE_MIXED_PRECISION=bf16`` of an engine's launch), and a
    later in-process probe of the same worker then trained under bf16 autocast: the floor lane's activation-offload
    test measured 34 MB of saved activations for 45."""
    before = dict(os.environ)
    yield
    if os.environ != before:
        os.environ.clear()
        os.environ.update(before)
