"""Workers: probes handed out through a storage the search and its workers share, so that one search probes on the
GPUs of several machines (issue 49, item 2). The search's side is ``HandOutRunner`` (a ``Runner``); the worker's is
``serve`` (``autofit worker``); the queue between them is an Optuna study (``ProbeQueue``) in a folder, Redis or a
database. The search's own study, and with it its resume, lock, report and dashboard, stays in its output folder."""

from autofit.workers._hand_out import HandOutRunner, ProbeJob
from autofit.workers._queue import ACCEPTED, QUEUE_FILE, ProbeQueue, open_storage
from autofit.workers._serve import serve

__all__ = ["ACCEPTED", "QUEUE_FILE", "HandOutRunner", "ProbeJob", "ProbeQueue", "open_storage", "serve"]
