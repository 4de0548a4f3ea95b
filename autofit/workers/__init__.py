"""Workers: probes handed out through a storage the search and its workers share, so that one search probes on the
GPUs of several machines (issue 49, item 2). The search's side is ``HandOutRunner`` (a ``Runner``); the worker's is
``serve`` (``autofit worker``); the queue between them is an Optuna study (``ProbeQueue``) in a folder, Redis or a
database. The search's own study, and with it its resume, lock, report and dashboard, stays in its output folder.
A worker runs only jobs signed with this user's queue key (``_signing``), and the queue's password is never shown
(``_storage``)."""

from autofit.workers._hand_out import HandOutRunner, ProbeJob
from autofit.workers._queue import ProbeQueue, QueueUnreadable
from autofit.workers._serve import serve
from autofit.workers._signing import KEY_ENV, KEY_FILE_ENV, key_path, queue_key
from autofit.workers._storage import ACCEPTED, PASSWORD_ENV, PASSWORD_FILE_ENV, QUEUE_FILE, open_storage

__all__ = ["ACCEPTED", "KEY_ENV", "KEY_FILE_ENV", "PASSWORD_ENV", "PASSWORD_FILE_ENV", "QUEUE_FILE", "HandOutRunner",
           "ProbeJob", "ProbeQueue", "QueueUnreadable", "key_path", "open_storage", "queue_key", "serve"]
