"""The session sshd fixture for the `ssh` tests (shared with other test folders, see
``tests/support/sshd_fixtures.py``)."""

from support.sshd_fixtures import SSHD, Sshd, sshd  # noqa: F401
