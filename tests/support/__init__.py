"""What the tests share: helpers importable from any test folder (``pythonpath`` in
``pyproject.toml`` puts ``tests/`` on ``sys.path``); fixtures are in ``conftest.py``.
A test module imports from here, never from another test module."""
