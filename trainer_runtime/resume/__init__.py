"""Resuming and loading: the checkpoint every rank agrees on (locally or from an object store),
the verified read of its files, and the restore into the live model, optimizers and position.
"""
