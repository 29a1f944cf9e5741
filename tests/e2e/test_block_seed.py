"""An A/B block's guests boot from the block's inputs on icount: the arm
variant's block number becomes $MEMQUAL_BOOT_SEED (e2e/base.py
``put_boot_seed``, called as a test takes its arm), so A and B of a block
share it, the next block has its own, and a test outside blocks leaves
none behind."""

from __future__ import annotations

import os

import pytest

from memqual.e2e.base import put_boot_seed


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    monkeypatch.delenv("MEMQUAL_BOOT_SEED", raising=False)


def test_a_block_s_arms_share_its_seed_and_the_next_block_has_its_own():
    put_boot_seed(3)  # A of block 3
    a = os.environ["MEMQUAL_BOOT_SEED"]
    put_boot_seed(3)  # B of block 3
    assert os.environ["MEMQUAL_BOOT_SEED"] == a == "3"
    put_boot_seed(4)
    assert os.environ["MEMQUAL_BOOT_SEED"] == "4"


def test_a_test_outside_blocks_leaves_no_seed():
    put_boot_seed(2)
    put_boot_seed(0)
    assert "MEMQUAL_BOOT_SEED" not in os.environ
