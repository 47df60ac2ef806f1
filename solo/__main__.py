"""`python -m solo [--nproc_per_node=N ...] [group=option ...] [key=value ...]`: the same as `solo-pretrain`."""

from solo.cli import pretrain_main

if __name__ == "__main__":
    pretrain_main()
