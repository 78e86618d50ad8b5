"""Packages made from built wheels: `.conda` (conda.py), a local channel index and py-rattler install.

CLI: python -m build_tools.packagers conda <wheel> --channel <dir> [--install-prefix <dir>]
"""
