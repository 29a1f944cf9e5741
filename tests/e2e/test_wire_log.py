"""A test's QMP and SSH protocol chatter goes to its own file, not through
Avocado's runner pipe (e2e/base.py WireLog); what matters still reaches
the test's debug.log."""

import logging
from collections.abc import Iterator

import pytest

from memqual.e2e.base import WIRE_LOGGERS, WireLog


class Collect(logging.Handler):
    """Stands in for Avocado's runner handler on the root logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [r.getMessage() for r in self.records]


# The loggers these tests log to, at the levels a test's process has
# them (memqual's CLI, run by other tests in this process, quiets qemu.qmp).
USED = ("qemu.qmp", "qemu.qmp.protocol", "paramiko", "paramiko.transport", "memqual.machine", "avocado.test")


@pytest.fixture
def root() -> Iterator[Collect]:
    handler = Collect()
    logger = logging.getLogger()
    level = logger.level
    saved = {name: (logging.getLogger(name).level, logging.getLogger(name).disabled) for name in USED}
    for name in USED:
        logging.getLogger(name).setLevel(logging.NOTSET)
        logging.getLogger(name).disabled = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)  # as Avocado sets it in a test's process
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        for name, (old_level, disabled) in saved.items():
            logging.getLogger(name).setLevel(old_level)
            logging.getLogger(name).disabled = disabled


def test_without_it_the_chatter_reaches_the_root_handler(root):
    # The control: this is what filled the runner's pipe.
    logging.getLogger("qemu.qmp.protocol").debug("--> query-balloon")
    assert "--> query-balloon" in root.messages()


def test_chatter_goes_to_the_file_only(tmp_path, root):
    wire = WireLog(tmp_path / "wire.log")
    wire.start()
    try:
        logging.getLogger("qemu.qmp.protocol").debug("--> query-balloon")
        logging.getLogger("paramiko.transport").debug("Secsh channel 4 opened.")
    finally:
        wire.stop()
    assert root.messages() == []
    text = (tmp_path / "wire.log").read_text()
    assert "qemu.qmp.protocol DEBUG| --> query-balloon" in text
    assert "paramiko.transport DEBUG| Secsh channel 4 opened." in text


def test_info_and_above_still_reach_the_root_handler_and_the_file(tmp_path, root):
    wire = WireLog(tmp_path / "wire.log")
    wire.start()
    try:
        logging.getLogger("qemu.qmp.protocol").error("connection reset")
        logging.getLogger("paramiko.transport").info("Connected (version 2.0)")
    finally:
        wire.stop()
    assert root.messages() == ["connection reset", "Connected (version 2.0)"]
    text = (tmp_path / "wire.log").read_text()
    assert "connection reset" in text and "Connected (version 2.0)" in text


def test_other_loggers_are_untouched(tmp_path, root):
    wire = WireLog(tmp_path / "wire.log")
    wire.start()
    try:
        logging.getLogger("memqual.machine").debug("QEMU started")
        logging.getLogger("avocado.test").debug("PARAMS")
    finally:
        wire.stop()
    assert root.messages() == ["QEMU started", "PARAMS"]
    assert not (tmp_path / "wire.log").exists()  # no chatter, no file


def state() -> dict[str, tuple[bool, list[logging.Handler]]]:
    return {name: (logging.getLogger(name).propagate, list(logging.getLogger(name).handlers)) for name in WIRE_LOGGERS}


def test_stop_restores_the_loggers_and_closes_the_file(tmp_path, root):
    before = state()
    wire = WireLog(tmp_path / "wire.log")
    wire.start()
    logging.getLogger("qemu.qmp").debug("one")
    wire.stop()
    assert state() == before
    logging.getLogger("qemu.qmp.protocol").debug("after stop")
    assert "after stop" in root.messages()
    assert "after stop" not in (tmp_path / "wire.log").read_text()
