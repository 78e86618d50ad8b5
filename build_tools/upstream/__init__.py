"""Getting a framework's tree at a tag, from wherever the user has it.

`sources.parse_source()` turns the --source option into a Source; `Source.ensure(tag)` returns the cached
git repository holding that tag. Tarballs (including Debian's orig tarballs) are imported once into a
cached repo and tagged, so every later step is plain git.
"""
from .sources import Source, cache_dir, parse_source

__all__ = ["Source", "cache_dir", "parse_source"]
