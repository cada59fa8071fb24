"""gunicorn settings for reckon's API (the ``web`` process)."""

import os

bind = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("RECKON_WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("RECKON_WEB_THREADS", "4"))
timeout = 30
graceful_timeout = 20
errorlog = "-"
# gunicorn >= 25.1 opens a control socket for gunicornc at one default path per user
# ($XDG_RUNTIME_DIR/gunicorn.ctl or ~/.gunicorn/gunicorn.ctl), shared by every gunicorn on the
# machine: a second stack would take over the first one's. reckon does not use it. (Older
# versions ignore this setting.)
control_socket_disable = True

# Every line JSON (pipeline/logs.py), on stderr: gunicorn's own, the app's and the access log. An
# access line holds method, path (no query string), status and duration, never a header.
logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "pipeline.logs.JsonFormatter", "process": "web"},
        "access": {"()": "pipeline.logs.AccessFormatter", "process": "web"},
    },
    "handlers": {
        "json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"},
        "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stderr"},
    },
    "root": {"level": "INFO", "handlers": ["json"]},
    "loggers": {
        "gunicorn.error": {"handlers": [], "propagate": True},  # level: gunicorn's --log-level
        "gunicorn.access": {"handlers": ["access"], "propagate": False},
    },
}


def on_starting(server: object) -> None:
    """Warnings become log records (JSON lines) in the master and the workers it forks."""
    import logging

    logging.captureWarnings(True)


def post_worker_init(worker: object) -> None:
    """Each API worker opens a connection per thread to the state and to the broker before it serves
    (pipeline/state/redisconn.py ``open_pools``): a load then opens none, whose buffers Redis would
    charge to the jobs of that load."""
    from pipeline.state.redisconn import open_pools

    open_pools(threads)
