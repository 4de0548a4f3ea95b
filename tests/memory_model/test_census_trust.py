"""The census cache as shared ground (issue 35, item 9): a planted census that rules every candidate out answered
"nothing fits" with zero probes. Every census autofit reads is checked as the weightless checkpoints are: its folder
created for this user and checked (owner, mode), its file a regular file of this user's that no one else may write,
never read through a link, and holding the key of what it was counted from."""

import json
import os

import pytest

from autofit.core import InputError
from autofit.memory_model._census import cached_census, census_file, store_census

CONFIG = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "vocab_size": 128}
DATA = {"params": [{"name": "w", "shape": [64, 64], "kind": "linear", "count": 2}], "linears": [], "tied": False}
PLANTED = {"params": [{"name": "w", "shape": [10**6, 10**6], "kind": "linear", "count": 1000}], "linears": [],
           "tied": False}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOFIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_census_autofit_stored_is_read_back(cache):
    store_census(CONFIG, DATA)
    census = cached_census(CONFIG)
    assert census is not None and census.params[0].count == 2


def test_a_planted_census_without_its_key_is_not_used(cache):
    path = census_file(CONFIG)
    path.write_text(json.dumps(PLANTED))  # a predictable name, a file that would rule every candidate out
    assert cached_census(CONFIG) is None


def test_another_configurations_census_is_not_used(cache):
    store_census({**CONFIG, "hidden_size": 128}, PLANTED)
    census_file({**CONFIG, "hidden_size": 128}).rename(census_file(CONFIG))
    assert cached_census(CONFIG) is None


def test_a_census_read_through_a_link_or_writable_by_others_is_not_used(cache, tmp_path):
    store_census(CONFIG, DATA)
    path = census_file(CONFIG)
    elsewhere = tmp_path / "elsewhere.json"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)  # the right content, through a link someone could point anywhere
    assert cached_census(CONFIG) is None
    path.unlink()
    elsewhere.rename(path)
    os.chmod(path, 0o666)
    assert cached_census(CONFIG) is None
    os.chmod(path, 0o644)
    assert cached_census(CONFIG) is not None


def test_a_census_folder_anyone_may_write_is_refused(cache):
    (cache / "census").mkdir(parents=True)
    os.chmod(cache, 0o700)
    os.chmod(cache / "census", 0o777)  # made by someone else's mkdir in a shared root, say
    with pytest.raises(InputError, match="census"):
        census_file(CONFIG)
