"""The patch factory: LMS sources + per-tag edit series -> patches/<framework>_<tag>_large_model_support.patch.

compose.py  the one route from the sources to a tree: the single LMS commit on the tag (pinned author,
            date, DEP-3 message), or a dev tree (edits as commits, sources linked)
export.py   writes it with `git format-patch` and checks committed patches for staleness
devtree.py  the developer loop: a worktree with the series as commits, then `save-edits` back
"""
