import contextlib
import os
import shutil

import pytest

# Never reach a model hub from tests; keep random-weight checkpoints out of the user's cache.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@contextlib.contextmanager
def _session_variable(name, value):
    """``name`` set to ``value`` for the whole session, then as it was."""
    previous = os.environ.get(name)
    os.environ[name] = str(value)
    try:
        yield value
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


@pytest.fixture(scope="session", autouse=True)
def _autofit_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("autofit-cache")
    with _session_variable("AUTOFIT_CACHE", cache):
        yield cache
    shutil.rmtree(cache, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _queue_key(tmp_path_factory):
    """The workers' queue key of the tests' own (never the user's ~/.config/autofit/queue.key): a search with
    --workers creates it where missing, and every worker process the tests start reads the same one."""
    with _session_variable("AUTOFIT_QUEUE_KEY_FILE", tmp_path_factory.mktemp("autofit-config") / "queue.key") as key:
        yield key


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
