"""The ``tapekit`` command's implementation (private): one module per command group.

:mod:`tapekit.cli` assembles the typer app from these. :mod:`tapekit._cli.common` holds what
every command shares: the one rule for finding the project's own modules
(:func:`~tapekit._cli.common.project_on_path`), loading an agent target, reading tape files.
Each command imports its heavy parts only when it runs, so ``tapekit --help`` stays fast.
"""
