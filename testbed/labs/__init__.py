"""Guided labs (``labs/NN-name/``): each a question answered on real packets, its runs
parsed from the lab's README, and a check of the runs against the expected observation."""
