"""The session sshd fixture for the `ssh` tests (shared with other test folders, see
``tests/sshd_fixtures.py``)."""

from sshd_fixtures import SSHD, Sshd, sshd  # noqa: F401
