"""``python -m dataset_rt``: the ``dataset-rt`` command."""

from dataset_rt.cli import main_exit

main_exit()
