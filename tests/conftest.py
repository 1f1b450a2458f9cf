import pytest
import torch


# Tiny test models run fastest single-threaded, and CI has two cores.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _default_skinny_choice():
    """`apply_cpu_kernels` tunes the skinny kernel for the machine, process-wide: each test starts from the default
    choice, so one that applied the kernels to a real model leaves no other test routing rows differently."""
    from carryover_hf.tools.cpu_kernels import SkinnyChoice, use_skinny_choice

    previous = use_skinny_choice(SkinnyChoice())
    yield
    use_skinny_choice(previous)
