"""The dispatcher's code type-checks (mypy): its command dispatch is a typed table, and
the rooms talk through declared interfaces (``admin.AdminHost``, the mixins' declared
attributes), so a wrong field or argument is caught before it runs."""

from __future__ import annotations

from pathlib import Path

import pytest

api = pytest.importorskip("mypy.api", reason="mypy is a dev dependency: pip install -e '.[dev]'")

ROOT = Path(__file__).resolve().parent.parent


def test_the_dispatcher_type_checks(tmp_path):
    out, err, status = api.run([str(ROOT / "zq" / "server"), "--ignore-missing-imports", "--follow-imports=silent",
                                "--cache-dir", str(tmp_path / "mypy-cache"), "--no-error-summary"])
    assert status == 0, out + err
