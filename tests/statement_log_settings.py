"""Settings of worker subprocesses whose statements are counted (see ``tests.statement_log``)."""

from tests.settings import *  # noqa: F403
from tests.statement_log import install

install()
