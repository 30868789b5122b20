"""``python -m harmonyrl.cli``: the ``harmonyrl`` command."""

from harmonyrl.cli import app

app()
