"""Harnesses that prove the LMS change compiles and works short of a full framework build.

tf_release.py   the TensorFlow release they check, from its profile (tag, version, wheel Pythons)
tf_allocator/   TensorFlow's BFC allocator with LMS as a standalone gtest program (CPU or CUDA)
                python -m build_tools.verify.tf_allocator --help
tf_wiring/      every C++ file of the TensorFlow patch compiled with TensorFlow's flags, symbols resolved
                python -m build_tools.verify.tf_wiring --help
They raise build_tools.errors.LmsError; their command lines print it and exit 2.
"""
