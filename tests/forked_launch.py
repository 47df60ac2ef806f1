"""`python tests/forked_launch.py N SCRIPT [ARG ...]`: SCRIPT as the N ranks of one process group on this machine,
each forked from this process once it has imported what the training imports (torch, torchvision, timm, Hydra, solo:
about 7 s of CPU here, which each rank of a torchrun launch pays for itself, and torchrun's agent for torch). For the
tests whose subject is the training, not the launcher; torchrun's own behaviour (its elastic restarts, its signals,
its death) is tested under torchrun (tests/test_restarts.py, tests/test_errors.py).

The ranks get the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, a free
MASTER_PORT, TORCHELASTIC_USE_AGENT_STORE): this process serves the store, as torchrun's agent does, so that it
outlives the process groups of several runs in one launch (tests/many_runs.py; rank 0's own store would close with
its group while rank 1 may still use it). They die with this process (the kernel's parent-death signal). As under
torchrun, the first rank to fail stops the others (SIGTERM), and this process exits with status 1; SIGTERM and SIGINT
sent to it reach every rank."""

import atexit
import ctypes
import os
import runpy
import signal
import socket
import sys
import traceback

from solo.launch import PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, world: int, port: int, script: str, args: list[str]) -> None:
    """In the forked child: become rank `rank` and run `script` as `python script args` would; never returns."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
    )
    sys.argv, sys.path[0] = [script, *args], os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):  # sys.exit("message"), as the interpreter would
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    world, script, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    import timm  # noqa: F401
    import torch.distributed

    import solo.cli  # noqa: F401  what every rank would import: paid here once
    import solo.train.trainer  # noqa: F401

    port, ranks = free_port(), {}
    for rank in range(world):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_rank(rank, world, port, script, args)
        ranks[pid] = rank
    # After the forks (a store's server thread would not survive one): the ranks' clients retry until it listens.
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)  # noqa: F841

    def forward(signum, _frame):
        for pid in ranks:
            os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed = False
    while ranks:
        pid, status = os.wait()
        ranks.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0 and not failed:
            failed = True
            forward(signal.SIGTERM, None)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
