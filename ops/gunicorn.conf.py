"""gunicorn settings for reckon's API (the ``web`` process)."""

import os

bind = f"127.0.0.1:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("RECKON_WEB_WORKERS", "2"))
worker_class = "gthread"
threads = int(os.environ.get("RECKON_WEB_THREADS", "4"))
timeout = 30
graceful_timeout = 20
# No access log: request paths name jobs and output locations, which stay out of logs.
accesslog = None
errorlog = "-"
