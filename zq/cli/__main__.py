"""``python -m zq.cli``: the ``zq`` command."""

from zq.cli.app import main

main()
