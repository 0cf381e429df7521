"""Fixtures shared by the backend tests (the docker daemon and image ones live in tests/conftest.py)."""
