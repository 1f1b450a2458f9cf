import torch


# Tiny test models run fastest single-threaded, and CI has two cores.
torch.set_num_threads(1)
