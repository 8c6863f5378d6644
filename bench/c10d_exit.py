"""How the benchmark scripts on torch.distributed end: bench/pod_allreduce_c10d.py,
bench/python_backend_call_cost.py and bench/torch_ddp_mnist.py."""
import os
import sys


def leave():
    """Exits once the figures are out, without tearing the process group down: torch 2.6's
    ProcessGroupGloo destructor joins its worker threads holding the GIL, and a worker still
    freeing a finished op's tensor whose Python object died waits for the GIL: a deadlock
    (pytorch#56297; pytorch#154976 releases the GIL there from torch 2.8). 2 pods x 2 ranks
    met it in 4 of about 45 runs of c10d gloo, rank 0 stuck in destroy_process_group."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
