"""TensorFlow's LMS wiring compiled for real, short of a Bazel build (the release of the profile).

No Bazel build of TensorFlow fits the project's machines (hours, pinned toolchains), so this is
the next best proof that ``make build TF=v2.14.1`` will not fail on the patch:

1. every C++ file the patch adds or edits, and ``config.pb.cc`` regenerated from the patched
   ``config.proto`` by protoc 3.21.9 (the release TF 2.14.1 pins), is compiled into an object
   file with the flags of TensorFlow's Linux GPU build (``flags.py``, read from the tree) against
   the official ``tensorflow==2.14.1`` GPU wheel's headers (``wheel.py``); the files of
   ``tensorflow/core/common_runtime/gpu/`` once more against CUDA 12 headers (setup's 12.4: the
   driver API of the 12.x a TensorFlow build pins) and CUDA 13 headers (the page backend's
   host-NUMA VMM calls are compiled out below CUDA 12.2, and the wheel ships CUDA 11.8);
2. every symbol those objects need is defined by the wheel's libraries, the C/C++ runtime or
   the patch's own objects, and none is defined twice (``symbols.py``); what the stock versions
   of the edited library files define (compiled too, from the upstream tree) is taken out of the
   wheel's symbols first, as the real build replaces those objects: a definition the patch drops
   cannot be found in the stock library;
3. the BUILD edits, API golden files and pybind names are consistent (``consistency.py``).

``check()`` returns a :class:`Report`; ``python -m build_tools.verify.tf_wiring`` prints it and
exits 1 when it has problems.  Every problem names the tree path of the file at fault.

check.py        the check of one tree (Report)
tree.py         the tree composed from the sources when none is given
compile.py, flags.py, symbols.py, consistency.py, wheel.py: the steps above
"""

from . import consistency, flags, symbols, wheel
from .check import GENERATED, GPU_DIR, PATCH, TAG, WHEEL_CUDA, Report, check, patch_files, upstream_texts
from .tree import lms_tree

__all__ = ["GENERATED", "GPU_DIR", "PATCH", "Report", "TAG", "WHEEL_CUDA", "check", "consistency", "flags",
           "lms_tree", "patch_files", "symbols", "upstream_texts", "wheel"]
