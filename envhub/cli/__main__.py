"""``python -m envhub.cli``: the same as the ``envhub`` command."""
from envhub.cli import main

main()
