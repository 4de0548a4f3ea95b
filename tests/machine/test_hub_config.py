"""resolve_model beyond the bundled models: a config.json fetched from the Hugging Face Hub (and only that file), and
every failure as a one-line UnknownModelError that says what to do.

No test reaches the real network: the hub is an http.server in a thread that answers what ``hf_hub_download``
asks (HEAD, then GET, of ``/{repo}/resolve/{revision}/{file}``), and huggingface_hub is pointed at it through
HF_ENDPOINT. huggingface_hub reads its settings into ``huggingface_hub.constants`` when it is first imported, so
the fixture patches those constants as well as the environment, and gives each test its own cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from autofit.machine import UnknownModelError, resolve_model

REPO = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_autofit_test_token"
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<filename>[^?]+)")


class FakeHub:
    """The part of the hub that hf_hub_download talks to. ``files``: repo id -> config.json bytes;
    ``errors``: repo id -> (HTTP status, X-Error-Code). Every request is recorded in ``requests``."""

    def __init__(self) -> None:
        self.files: Dict[str, bytes] = {}
        self.errors: Dict[str, Tuple[int, Optional[str]]] = {}
        self.requests: List[Tuple[str, str, Optional[str]]] = []  # method, path, Authorization header
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join()
        self.server.server_close()

    def resolved_files(self) -> List[str]:
        return [path for _, path, _ in self.requests if RESOLVE.match(path)]

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                hub.requests.append(("HEAD", self.path, self.headers.get("Authorization")))
                self._answer(with_body=False)

            def do_GET(self) -> None:
                hub.requests.append(("GET", self.path, self.headers.get("Authorization")))
                self._answer(with_body=True)

            def _answer(self, with_body: bool) -> None:
                match = RESOLVE.match(self.path)
                if match is None:  # e.g. /api/agent-harnesses, which huggingface_hub asks for on the side
                    return self._status(404, None)
                repo, filename = match["repo"], match["filename"]
                if repo in hub.errors:
                    return self._status(*hub.errors[repo])
                if repo not in hub.files:
                    return self._status(404, "RepoNotFound")
                if filename != "config.json":
                    return self._status(404, "EntryNotFound")
                body = hub.files[repo]
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha1(body).hexdigest()}"')
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                if with_body:
                    self.wfile.write(body)

            def _status(self, status: int, error_code: Optional[str]) -> None:
                self.send_response(status)
                if error_code is not None:
                    self.send_header("X-Error-Code", error_code)
                if error_code == "EntryNotFound":  # the hub names the commit it looked in
                    self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        return Handler


def point_huggingface_hub_at(monkeypatch, endpoint: str, home: Path) -> None:
    """HF_ENDPOINT, an isolated HF_HOME/HF_HUB_CACHE, online, a test token: in the environment and in the
    constants huggingface_hub derived from it at import."""
    from huggingface_hub import constants, file_download

    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    if hasattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE"):  # huggingface_hub < 1.0 copied it at import
        monkeypatch.setattr(file_download, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"), raising=False)
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"), raising=False)
    monkeypatch.setattr(constants, "AGENT_HARNESSES_PATH", str(home / ".agent_harnesses.json"), raising=False)
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_OIDC_RESOURCE", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", TOKEN)


def close_hub_sessions() -> None:
    """Drop huggingface_hub's pooled HTTP sessions: they may hold an offline adapter or a dead server's socket."""
    import huggingface_hub.utils as hub_utils

    close = getattr(hub_utils, "close_session", None) or getattr(hub_utils, "reset_sessions", None)
    if close is not None:
        close()


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub()
    point_huggingface_hub_at(monkeypatch, fake.endpoint, tmp_path / "hf-home")
    close_hub_sessions()
    yield fake
    fake.stop()
    close_hub_sessions()


def error_of(name: str) -> str:
    with pytest.raises(UnknownModelError) as err:
        resolve_model(name)
    message = str(err.value)
    assert "\n" not in message and message.strip() == message, message
    return message


def cached_config(tmp_path: Path, repo: str) -> Path:
    return tmp_path / "hf-home" / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / COMMIT / "config.json"


# -- fetched from the hub ---------------------------------------------------------------------------------------
def test_fetches_only_config_json_into_the_cache(hub, tmp_path):
    hub.files["someone/new-model"] = json.dumps({"model_type": "llama", "hidden_size": 64}).encode()
    source = resolve_model("someone/new-model")
    assert source.config == {"model_type": "llama", "hidden_size": 64}
    assert source.name == "someone/new-model" and source.local_path is None
    assert cached_config(tmp_path, "someone/new-model").is_file()
    assert {path for path in hub.resolved_files()} == {"/someone/new-model/resolve/main/config.json"}
    assert all(auth == f"Bearer {TOKEN}" for _, path, auth in hub.requests if RESOLVE.match(path))  # HF_TOKEN


def test_a_fetched_config_is_found_again_without_the_hub(hub, monkeypatch):
    hub.files["someone/new-model"] = json.dumps({"model_type": "qwen2"}).encode()
    assert resolve_model("someone/new-model").model_type == "qwen2"
    hub.stop()
    assert resolve_model("someone/new-model").model_type == "qwen2"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("someone/new-model").model_type == "qwen2"
    assert len(hub.resolved_files()) == 2  # the first call's HEAD and GET, nothing since


# -- the hub refuses -------------------------------------------------------------------------------------------
def test_gated_model(hub):
    hub.errors["meta-llama/Gated-1B"] = (401, "GatedRepo")
    message = error_of("meta-llama/Gated-1B")
    assert "'meta-llama/Gated-1B'" in message and "gated" in message
    assert "login" in message and "HF_TOKEN" in message and f"{hub.endpoint}/meta-llama/Gated-1B" in message


def test_model_not_on_the_hub(hub):
    message = error_of("nobody/no-such-model")
    assert "'nobody/no-such-model'" in message and "does not exist" in message and "private" in message
    assert "HF_TOKEN" in message


def test_repository_without_config_json(hub):
    hub.errors["someone/adapter-only"] = (404, "EntryNotFound")
    message = error_of("someone/adapter-only")
    assert "'someone/adapter-only'" in message and "no config.json" in message


def test_other_hub_error_names_its_class(hub):
    hub.errors["someone/forbidden"] = (403, None)
    message = error_of("someone/forbidden")
    assert "'someone/forbidden'" in message and "HfHubHTTPError" in message and "403" in message


# -- offline --------------------------------------------------------------------------------------------------
def test_offline_without_a_cached_config(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = error_of("someone/never-fetched")
    assert "'someone/never-fetched'" in message and "not in the Hugging Face cache" in message
    assert "HF_HUB_OFFLINE" in message and "tiny-qwen2" in message and "local folder" in message
    assert hub.requests == []


def test_offline_mode_set_before_huggingface_hub_was_imported(hub, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # the environment no longer says so
    close_hub_sessions()
    message = error_of("someone/never-fetched")
    assert "offline mode" in message and "tiny-qwen2" in message
    assert hub.resolved_files() == []


def test_hub_cannot_be_reached(hub, tmp_path, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    point_huggingface_hub_at(monkeypatch, closed, tmp_path / "hf-home")
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # huggingface_hub retries with back-off
    message = error_of("someone/never-fetched")
    assert "'someone/never-fetched'" in message and "could not be reached" in message and "tiny-qwen2" in message


# -- configurations that cannot be used ---------------------------------------------------------------------------
def model_folder(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


def test_malformed_config_names_file_line_and_column(tmp_path):
    folder = model_folder(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": \n}\n')
    message = error_of(str(folder))
    assert str(folder / "config.json") in message and "not valid JSON" in message
    assert "line 4, column 1" in message


def test_config_that_is_a_list(tmp_path):
    folder = model_folder(tmp_path, '[{"model_type": "llama"}]')
    message = error_of(str(folder))
    assert str(folder / "config.json") in message and "an array" in message and "not a JSON object" in message


def test_config_without_model_type(tmp_path):
    folder = model_folder(tmp_path, '{"hidden_size": 8}')
    message = error_of(str(folder))
    assert str(folder / "config.json") in message and "model_type" in message


def test_malformed_config_from_the_hub_names_the_cached_file(hub, tmp_path):
    hub.files["someone/broken"] = b'{"model_type": '
    message = error_of("someone/broken")
    assert str(cached_config(tmp_path, "someone/broken")) in message and "line 1, column 16" in message


def test_malformed_config_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    snapshot = tmp_path / "hub" / "models--someone--cached" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('"just a string"')
    message = error_of("someone/cached")
    assert str(snapshot / "config.json") in message and "a string" in message


def test_name_that_is_neither_a_folder_nor_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    message = error_of("no/such/folder")
    assert "'no/such/folder'" in message and "owner/name" in message and "tiny-qwen2" in message


# -- cheap to import ------------------------------------------------------------------------------------------
def test_importing_the_registry_imports_neither_torch_nor_the_hub_client():
    code = ("import sys, autofit.machine._registry; "
            "print(sorted(m for m in ('torch', 'transformers', 'huggingface_hub') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
