"""rankkit.infra.transfer: host-to-device copies that do not block the host."""
import torch

from simcuda import from_sim, simcuda

from rankkit.infra.transfer import upload


def test_upload_leaves_host_tensors_alone_on_the_cpu():
    a, b = torch.arange(3), torch.tensor([7, 8])
    got = upload("cpu", a, b)
    assert got[0] is a and got[1] is b


def test_upload_to_a_gpu_is_one_copy_that_does_not_wait():
    # On CUDA a copy from pageable memory waits for the device; from pinned memory with
    # non_blocking it does not. The simulated device counts a blocking copy as a sync.
    a, b = torch.arange(5), torch.tensor([-3, 9])
    with simcuda() as counts:
        counts.reset()
        got = upload(torch.device("cuda"), a, b)
        assert counts.syncs == 0 and counts.h2d == 1, dict(counts.sync_sites)
        assert [t.device.type for t in got] == ["cuda", "cuda"]
        assert torch.equal(from_sim(got[0]), a) and torch.equal(from_sim(got[1]), b)
        counts.reset()
        torch.tensor([1, 2], device="cuda")  # what it replaces: a blocking copy
        assert counts.syncs == 1
