"""What runs on Spark: ``source`` (the PySpark data source ``zq``: batch and streaming
reads of the journal, writes as publishes) and ``columnar`` (a RANGE answer parsed into
Arrow columns at once, on the executors). ``pip install 'zq[spark]'``."""

from zq.spark.source import (
    ZqDataSource,
    ZqStreamWriter,
    ZqWriter,
    decoded_messages_batch,
    events_batch,
    local_session,
    messages_batch,
    publish_batches,
    register,
)

__all__ = ["ZqDataSource", "ZqStreamWriter", "ZqWriter", "decoded_messages_batch", "events_batch", "local_session",
           "messages_batch", "publish_batches", "register"]
