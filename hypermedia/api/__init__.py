"""The HTTP API (FastAPI) and the server that runs it."""
