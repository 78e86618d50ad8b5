"""Packages made from built wheels: `.conda` (conda.py), a local channel index and py-rattler install.

conda.py  the .conda, the channel index, installs
steps.py  the packaging steps a build's Plan ends with (the conda package of an overlay build)

CLI: python -m build_tools.packagers conda <wheel> --channel <dir> [--install-prefix <dir>]
"""
