"""What decides whether a stored probe is still valid (issue 35, item 10): the fingerprint left out autofit's own
version, flash-attn, liger-kernel and triton, the allocator's environment variables and the driver; a user's
factory was named by that one function's bytecode alone (not the helpers it calls, its module's globals or the
data files it loads). Each of these can change a peak, and each now changes the fingerprint or the identity."""

import textwrap

from autofit.probe._factory import identity
from autofit.search import _store
from autofit.search._store import MEASURING_PACKAGES, fingerprint

CONFIG = {"model_type": "qwen2", "hidden_size": 64}


def test_autofit_and_the_kernel_libraries_are_in_the_fingerprint(monkeypatch):
    for package in ("trl-autofit", "flash-attn", "liger-kernel", "triton"):
        assert package in MEASURING_PACKAGES
    before = fingerprint(CONFIG, "cpu")
    real = _store.installed_versions

    def other_autofit(packages):
        found = real(packages)
        found["trl-autofit"] = "99.0"
        return found

    monkeypatch.setattr(_store, "installed_versions", other_autofit)
    assert fingerprint(CONFIG, "cpu") != before


def test_the_allocator_environment_and_the_driver_are_in_the_fingerprint(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    plain = fingerprint(CONFIG, "cuda", "H100", "550.54")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert fingerprint(CONFIG, "cuda", "H100", "550.54") != plain
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert fingerprint(CONFIG, "cuda", "H100", "560.28") != plain
    assert fingerprint(CONFIG, "cuda", "H100", "550.54") == plain


def load(path):
    namespace = {"__name__": "my_trainers"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["make"]


def test_a_factorys_helpers_globals_and_data_files_are_in_its_identity(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"text": "short"}\n')
    source = tmp_path / "train.py"
    source.write_text(textwrap.dedent(f"""
        LENGTH = 128

        def helper(candidate):
            return candidate

        def make(candidate):
            open({str(data)!r}).read()
            return helper(candidate), LENGTH
    """))
    first = identity(load(source))
    source.write_text(source.read_text().replace("LENGTH = 128", "LENGTH = 4096"))  # a global, not make's code
    assert identity(load(source)) != first
    second = identity(load(source))
    source.write_text(source.read_text().replace("return candidate\n", "return candidate  # bigger\n"))
    third = identity(load(source))
    assert third != second  # a helper's change
    data.write_text('{"text": "' + "long " * 1000 + '"}\n')  # the data the factory loads
    assert identity(load(source)) != third
