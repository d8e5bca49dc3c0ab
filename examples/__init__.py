"""Runnable examples; each works offline (``python examples/<name>.py``)."""
