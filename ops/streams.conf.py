"""gunicorn settings for reckon's event streams (the ``streams`` process: api/streams/, uvicorn workers).

It listens on ``RECKON_STREAMS_PORT``, else ``PORT`` (what honcho gives the process: ``make run`` serves it
on 8700), else 8700.
"""

import os

bind = f"127.0.0.1:{os.environ.get('RECKON_STREAMS_PORT') or os.environ.get('PORT') or '8700'}"
workers = int(os.environ.get("RECKON_STREAMS_WORKERS", "1"))
worker_class = "api.streams.worker.StreamsWorker"
timeout = 30
graceful_timeout = 10
keepalive = 5
errorlog = "-"
control_socket_disable = True  # as ops/gunicorn.conf.py says

logconfig_dict = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "pipeline.logs.JsonFormatter", "process": "streams"},
    },
    "handlers": {
        "json": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"},
    },
    "root": {"level": "INFO", "handlers": ["json"]},
    "loggers": {
        "gunicorn.error": {"handlers": [], "propagate": True},
        "uvicorn.error": {"handlers": [], "propagate": True},
    },
}


def on_starting(server: object) -> None:
    """Warnings become log records (JSON lines) in the master and the workers it forks."""
    import logging

    logging.captureWarnings(True)
