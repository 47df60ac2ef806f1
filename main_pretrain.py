"""Pretrain a backbone: `torchrun --nproc_per_node=N main_pretrain.py method=simclr [key=value ...]`.

The same as the `solo-pretrain` command that `pip install` puts on the PATH.
"""

from solo.cli import pretrain_main

if __name__ == "__main__":
    pretrain_main()
