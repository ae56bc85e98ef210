"""servegate.server: a manifest as an OpenAI-compatible HTTP service (`gate serve`).

`create_app(served, engine)` builds the FastAPI app; `serve(app, host, port, grace_s)` runs it on uvicorn
with a draining shutdown.
"""

from servegate.server.app import create_app
from servegate.server.uvicorn_runner import serve

__all__ = ["create_app", "serve"]
