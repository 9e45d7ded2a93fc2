"""One training run as the manager sees it: its settings, the context its parts share, the
coordination between ranks, and the manager's construction.
"""
