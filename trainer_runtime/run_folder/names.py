"""The file names of a run folder's layout, as plain constants (docs/runtime.md).

A module of its own so that the modules that read, delete and set aside checkpoints can name
the files without importing what writes them: the data-file names used to live beside the
writer (``sharded/storage.py``, which imports torch), so ``layout`` reached into
``rejection`` for them at call time while ``rejection`` imported ``layout``. Nothing here
imports anything of the runtime; ``tests/unit/test_run_folder_names.py`` holds these equal to
the writer's.
"""

from __future__ import annotations

import re

MANIFEST_NAME = "manifest.json"
"""In a checkpoint folder, written last: its presence is the commit."""
POINTER_NAME = "latest.json"
"""In the run folder: the newest committed checkpoint (a hint; resume lists the folder)."""
METADATA_NAME = ".metadata"
"""DCP's metadata file in a format-2 checkpoint (``sharded/storage.py`` writes it)."""
DATA_SUFFIX = ".distcp"
"""The suffix of a format-2 data file (``sharded/storage.py`` writes them)."""
FORMAT1_RANK_FILE = re.compile(r"rank\d+\.pt")
"""A format-1 data file (``rank{r}.pt``). Not any ``*.pt``: a folder of the user's holding
one (``export/weights.pt``, the weights ``rtj-checkpoints export`` wrote into the run folder)
was taken for a crashed save's leftover and deleted at the next resume."""
DATA_FILE = re.compile(rf"(.+{re.escape(DATA_SUFFIX)}|{FORMAT1_RANK_FILE.pattern})")
"""A checkpoint's data file: format 2's ``*.distcp``, format 1's ``rank{r}.pt``."""

REJECTED_DIR = "rejected"
"""Where resume moves the checkpoints it passed over (``resume/rejection.py``); never a
candidate."""
REASON_FILE = "REJECTED.txt"
"""In a folder moved into ``rejected/`` locally: when and why."""
REMOTE_REASON_FILE = "reason.json"
"""In ``<run>/rejected/<name>/`` in a bucket, beside the manifest kept: when and why."""
TRIMMED_FILE = "DATA-DELETED.txt"
"""In a folder in ``rejected/`` whose data files were deleted (``REJECTED_WITH_DATA``)."""
REJECTED_WITH_DATA = 2
"""How many folders in ``rejected/`` keep their data files: the newest set aside. Older ones
keep their manifest, ``.metadata`` and ``REJECTED.txt``, as the bucket keeps its rejected
checkpoints; kept whole, every checkpoint that resume set aside (one per relaunch when the
operator quarantines the newest) added a full checkpoint to the node's disk until a save
failed for want of space."""


def is_checkpoint_file(name: str) -> bool:
    """Whether a save or download writes a file of this name into a checkpoint folder."""
    return DATA_FILE.fullmatch(name) is not None or name in (METADATA_NAME, MANIFEST_NAME)
