"""The tapekit Studio: a local web app to browse, diff, edit and resume stored tapes.

``tapekit studio --db tapekit.db`` serves it; :func:`create_app` gives the ASGI app for tests or
embedding. Needs the ``studio`` extra (FastAPI, uvicorn, Jinja2); ``import tapekit`` never
imports it.
"""

from tapekit.studio.app import create_app, serve

__all__ = ["create_app", "serve"]
