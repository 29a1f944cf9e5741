"""The fixture of the tests that run guest/kvm_lookup.c on this machine's
/dev/kvm: a KVM that runs the lookup guest (the Python benchmark's own
probe) with ioeventfds, or a skip with the reason."""

from __future__ import annotations

import pytest

from memqual.host.core import kvm as K
from memqual.host.core import kvm_uapi as uapi
from memqual.host.memslots import kvm_bench


@pytest.fixture(scope="module")
def runnable() -> None:
    try:
        kvm = K.Kvm()
    except K.KvmUnavailable as exc:
        pytest.skip(str(exc))
    with kvm:
        if not kvm.check_extension(uapi.KVM_CAP_IOEVENTFD):
            pytest.skip("/dev/kvm has no KVM_CAP_IOEVENTFD")
        reason = kvm_bench.probe_vcpu(kvm)
    if reason is not None:
        pytest.skip(reason)
