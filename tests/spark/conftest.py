"""A real local Spark session for the zq data source tests (session-scoped)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def java_problem() -> str | None:
    """What `spark-class` would trip on: JAVA_HOME wins, else `java` on PATH, 17+."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return "Spark tests need Java 17+ (no java found); e.g. apt-get install openjdk-17-jre-headless"
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    try:
        major = int(out.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        return f"cannot tell the Java version from: {out[:200]!r}"
    return None if major >= 17 else f"Spark needs Java 17+, found {major}"


def skip_or_fail(reason: str) -> None:
    """CI sets ZQ_REQUIRE_SPARK=1: there a missing Spark is a failure, never a skip."""
    if os.environ.get("ZQ_REQUIRE_SPARK"):
        pytest.fail(f"ZQ_REQUIRE_SPARK is set but: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def spark():
    for module in ("pyspark", "pyarrow"):
        try:
            __import__(module)
        except ImportError:
            skip_or_fail(f"Spark tests need {module}: pip install 'zq[spark]'")
    problem = java_problem()
    if problem:
        skip_or_fail(problem)
    from zq.spark import local_session

    session = local_session("zq-tests")
    yield session
    session.stop()
