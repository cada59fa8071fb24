"""reckon's HTTP API (Falcon, WSGI)."""
