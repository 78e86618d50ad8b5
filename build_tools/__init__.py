"""Build tools for Large Model Support (LMS) patched PyTorch and TensorFlow.

In layers, lowest first (build_tools/layers.py declares them; tests/test_layers.py holds the imports to
them: a part imports its own layer or lower ones, and no import cycle):
  base            errors, progress, catalog (frameworks, tags, profiles), gitutil, fetch, archives,
                  atomic (whole-file placement), tools + toolchain (finding programs, checking versions),
                  wheels (the one wheel downloader), cudahome + cuda_headers (CUDA headers), buildlock
  upstream/       getting a framework's tree at a tag (git remote, local mirror, git URL, tarball, Debian)
  abi/, c10_build/  the ABI check and the c10 compile the overlay build uses
  patch_factory/  composing LMS sources + per-tag edits into a tree: the one route to every LMS tree,
                  and the user-facing `git am` patch exported from it
  patch_ops/      apply / verify / rebase of exported and users' patches
  overlay/, builders/  fast PyTorch build on top of the official wheel; full framework builds as plans
  packagers/      conda packages made from built wheels
  verify/         harnesses proving the TensorFlow change short of a full build (allocator, wiring)
  cli.py          the command line
Run `python -m build_tools --help`.
"""

# The LMS release these tools produce. It appears in every exported patch header and in the local
# version of built wheels (+lms<LMS_BUILD>), so bump it when the LMS sources change meaningfully.
LMS_VERSION = "0.1.0"
LMS_BUILD = 1
# Fixed author/date of exported patches: the same sources always give the same bytes.
PATCH_AUTHOR_NAME = "LMS Build Tools"
PATCH_AUTHOR_EMAIL = "lms-build-tools@users.noreply.github.com"
PATCH_DATE = "2026-11-22T00:00:00+00:00"
