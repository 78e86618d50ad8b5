"""The patch factory: LMS sources + per-tag edit series -> patches/<framework>_<tag>_large_model_support.patch.

compose.py  builds the single LMS commit on the tag (pinned author, date, DEP-3 message)
export.py   writes it with `git format-patch` and checks committed patches for staleness
devtree.py  the developer loop: a worktree with the series as commits, then `save-edits` back
"""
