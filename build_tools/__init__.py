"""Build tools for Large Model Support (LMS) patched PyTorch and TensorFlow.

Folders, by what they do:
  upstream/       getting a framework's tree at a tag (git remote, local mirror, git URL, tarball, Debian)
  patch_factory/  composing LMS sources + per-tag edits into the user-facing `git am` patch
  patch_ops/      apply / verify / rebase of the exported patches
  builders/       full framework builds (setup.py for PyTorch, bazel for TensorFlow)
  overlay/        fast PyTorch build: rebuild only libc10_cuda on top of the official wheel
  packagers/      conda packages made from built wheels
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
