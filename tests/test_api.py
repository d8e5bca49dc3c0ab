"""The public API: importable from the package root, documented, and light to import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import tapekit


def test_every_public_name_is_exported_and_documented() -> None:
    missing = []
    for name in tapekit.__all__:
        obj = getattr(tapekit, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (
                    inspect.isfunction(member) or isinstance(member, classmethod | property)
                ):
                    continue
                target = member.__func__ if isinstance(member, classmethod) else member
                target = target.fget if isinstance(target, property) else target
                if not (target.__doc__ or "").strip():
                    missing.append(f"{name}.{attr}")
    assert missing == []


def test_import_pulls_no_heavy_dependencies() -> None:
    code = (
        "import sys, tapekit; heavy = {'torch', 'transformers', 'litellm', 'fastapi', 'uvicorn', 'openai'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
