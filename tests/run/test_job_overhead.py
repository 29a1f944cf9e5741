"""What a job of blocks costs beyond its test runs' own times
(host/run/blocks.py job_overhead_s): once a job, then each test run."""

import pytest

from memqual.host.run.blocks import JOB_OVERHEAD_S, RUN_OVERHEAD_S, job_overhead_s


def test_a_job_of_no_test_runs_costs_its_start_and_end():
    assert job_overhead_s(0) == JOB_OVERHEAD_S


def test_each_test_run_adds_its_runner_and_its_end():
    assert job_overhead_s(4) == pytest.approx(JOB_OVERHEAD_S + 4 * RUN_OVERHEAD_S)
    assert job_overhead_s(10) - job_overhead_s(9) == pytest.approx(RUN_OVERHEAD_S)


def test_a_big_block_costs_more_than_a_small_one():
    # A flat figure per job cannot say this: 44 test runs cost seconds more than 4.
    assert job_overhead_s(44) > job_overhead_s(4) + 20


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError):
        job_overhead_s(-1)
