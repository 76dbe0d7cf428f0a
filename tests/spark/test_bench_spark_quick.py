"""The Spark bench scenario in --quick mode, on the suite's Spark session (it needs Java,
so it lives with the Spark tests rather than in tests/test_bench_quick.py)."""

from ..test_bench_quick import check_quick_run


def test_quick_spark_bench_runs_and_writes_complete_results(spark, tmp_path, capsys):
    check_quick_run("spark", tmp_path, capsys)
    assert spark.range(3).count() == 3  # the bench left the suite's session running
