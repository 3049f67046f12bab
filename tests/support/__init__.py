"""What the tests share: real server, manager and client processes, clients and samples.

pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in pyproject.toml), so a test imports
``from support.serverproc import ServerProcess`` from any folder.
"""
