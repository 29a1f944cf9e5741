"""An A/B block's guests boot from the block's inputs on icount: the arm
variant's block number becomes $MEMQUAL_BOOT_SEED (e2e/base.py), so A and
B of a block share it, the next block has its own, and a test outside
blocks leaves none behind."""

from __future__ import annotations

import logging
import os

import pytest

from memqual.e2e.base import GuestTest


class Params:
    def __init__(self, **values: object) -> None:
        self.values = values

    def get(self, name: str, default: object = None) -> object:
        return self.values.get(name, default)


class Variant:
    """What GuestTest reads of an Avocado test when it takes its arm."""

    log = logging.getLogger("test_block_seed")

    def __init__(self, **params: object) -> None:
        self.params = Params(**params)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in ("MEMQUAL_BOOT_SEED", "MEMQUAL_GUEST_KERNEL", "MEMQUAL_RUN_LABEL", "MEMQUAL_QEMU"):
        monkeypatch.delenv(name, raising=False)


def take_arm(variant: Variant) -> None:
    GuestTest._take_arm(variant)  # type: ignore[arg-type]  # the two attributes it reads


def test_a_block_s_arms_share_its_seed_and_the_next_block_has_its_own():
    take_arm(Variant(arm="A", block=3))
    a = os.environ["MEMQUAL_BOOT_SEED"]
    take_arm(Variant(arm="B", block=3))
    assert os.environ["MEMQUAL_BOOT_SEED"] == a == "3"
    take_arm(Variant(arm="B", block=4))
    assert os.environ["MEMQUAL_BOOT_SEED"] == "4"


def test_a_test_outside_blocks_leaves_no_seed():
    take_arm(Variant(arm="A", block=2))
    take_arm(Variant())
    assert "MEMQUAL_BOOT_SEED" not in os.environ
