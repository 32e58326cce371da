"""Tools the agents call (one module per tool; the bash tool's parts in ``bash_*.py`` and
``docker_client.py``) and the sandbox image they run in."""
