"""zq: a journaled ZeroMQ work-queue dispatcher.

The pure queue engine lives in ``zq.core``; journals in ``zq.journal``.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
