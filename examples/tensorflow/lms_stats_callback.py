#!/usr/bin/env python3
"""Allocator statistics for Keras training, with TensorFlow Large Model Support.

`AllocatorStatsCallback` records the GPU allocator statistics of a device
every N batches and at the end of each epoch, and prints a summary:

    from lms_stats_callback import AllocatorStatsCallback, configure_lms
    configure_lms(enable=True, defrag=True)        # before any op runs
    model.fit(ds, callbacks=[AllocatorStatsCallback("GPU:0", every_n_batches=10)])

On a TensorFlow built with the LMS patch (`make build TF=v2.14.1`) the
statistics come from `tf.config.experimental.get_memory_stats(device)`: bytes
in use, peak, limit, reserved, number of allocations, largest allocation, GPU
host bytes in use, and the LMS counters (bytes swapped out/in, reclaims,
defragmentations, host swap bytes in use).  On a stock TensorFlow the callback
falls back to `tf.config.experimental.get_memory_info` (current/peak) and says
so; on a machine without GPU there are no allocator statistics at all (stock
TensorFlow does not track the CPU allocator), which it also says.

Run as a script for a small demo (works on the CPU with tiny sizes):

    python examples/tensorflow/lms_stats_callback.py --image-size 32 --batch-size 4 --steps 3
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

MiB = 1 << 20
LMS_FUNCTIONS = ("set_lms_enabled", "get_lms_enabled", "set_lms_defrag_enabled",
                 "get_lms_defrag_enabled", "get_memory_stats")


def lms_available() -> bool:
    """True on a TensorFlow built with the LMS patch."""
    exp = tf.config.experimental
    return all(hasattr(exp, f) for f in LMS_FUNCTIONS)


def not_lms_build_message() -> str:
    return (f"TensorFlow {tf.__version__} (from {os.path.dirname(tf.__file__)}) is not a "
            "Large Model Support build: tf.config.experimental has no set_lms_enabled. "
            "Build the patched TensorFlow (make build TF=v2.14.1) to use LMS.")


def configure_lms(enable: bool, defrag: bool = False, verbose: bool = True) -> bool:
    """Switches LMS on/off before the GPUs are initialized.  Returns whether
    LMS is active; on a stock TensorFlow prints why it is not."""
    if not (enable or defrag):
        return False
    if not lms_available():
        if verbose:
            print(f"[LMS] {not_lms_build_message()} The LMS switches are ignored.", flush=True)
        return False
    tf.config.experimental.set_lms_enabled(enable)
    tf.config.experimental.set_lms_defrag_enabled(defrag)
    if verbose:
        print(f"[LMS] enabled={tf.config.experimental.get_lms_enabled()} "
              f"defrag={tf.config.experimental.get_lms_defrag_enabled()} "
              f"TF_GPU_HOST_MEM_LIMIT_IN_MB={os.environ.get('TF_GPU_HOST_MEM_LIMIT_IN_MB', '(default)')}",
              flush=True)
    return True


def read_stats(device: str) -> tuple[str, dict | None, str]:
    """(source, stats, note): the richest statistics this TensorFlow offers."""
    exp = tf.config.experimental
    if hasattr(exp, "get_memory_stats"):
        try:
            return "get_memory_stats", dict(exp.get_memory_stats(device)), ""
        except (ValueError, NotImplementedError) as e:
            note = str(e)
    else:
        note = "get_memory_stats: not an LMS build"
    try:
        info = exp.get_memory_info(device)
        return "get_memory_info", {"bytes_in_use": info["current"],
                                   "peak_bytes_in_use": info["peak"]}, note
    except (ValueError, RuntimeError) as e:
        return "none", None, f"{note}; get_memory_info({device!r}): {e}".strip("; ")


# Keys a record carries besides the allocator's statistics (see AllocatorStatsCallback._record).
RECORD_KEYS = ("where", "time_s", "source", "batch", "epoch")


def format_stats(stats: dict) -> str:
    """One line of the statistics in `stats` (a read_stats result or a record): byte counts in MiB,
    counts and flags as they are; a record's own keys are left out."""
    order = ["bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved", "num_allocs",
             "largest_alloc_size", "gpu_host_bytes_in_use", "lms_host_bytes_in_use",
             "lms_bytes_swapped_out", "lms_bytes_swapped_in", "lms_num_reclaims",
             "lms_num_defrag_events", "lms_num_failures"]
    parts = []
    for k in order + sorted(set(stats) - set(order) - set(RECORD_KEYS)):
        if k not in stats:
            continue
        v = stats[k]
        counted = k.startswith("num") or "num_" in k or k in ("lms_enabled", "lms_defrag_enabled")
        if counted or isinstance(v, bool) or not isinstance(v, (int, float)):
            parts.append(f"{k}={v}")
        else:
            parts.append(f"{k}={v / MiB:.1f}MiB")
    return " ".join(parts)


class AllocatorStatsCallback(tf.keras.callbacks.Callback):
    """Records allocator (and LMS) statistics of `device` during fit()."""

    def __init__(self, device: str | None = None, every_n_batches: int = 0,
                 print_fn=print, json_path: str | None = None):
        super().__init__()
        if device is None:
            device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
        self.device = device
        self.every_n_batches = every_n_batches
        self.print_fn = print_fn
        self.json_path = json_path
        self.records: list[dict] = []
        self._warned = False
        self._t0 = time.time()

    def _record(self, where: str, **extra):
        source, stats, note = read_stats(self.device)
        if stats is None:
            if not self._warned:
                self.print_fn(f"[stats] no allocator statistics for {self.device}: {note}")
                self._warned = True
            return
        if note and not self._warned:
            self.print_fn(f"[stats] {note}; using {source}")
            self._warned = True
        rec = {"where": where, "time_s": round(time.time() - self._t0, 3), "source": source,
               **extra, **stats}
        self.records.append(rec)
        return rec

    def on_train_batch_end(self, batch, logs=None):
        if self.every_n_batches and (batch + 1) % self.every_n_batches == 0:
            rec = self._record("batch", batch=batch)
            if rec:
                self.print_fn(f"[stats] batch {batch}: {format_stats(rec)}")

    def on_epoch_end(self, epoch, logs=None):
        rec = self._record("epoch", epoch=epoch)
        if rec:
            self.print_fn(f"[stats] epoch {epoch} on {self.device}: {format_stats(rec)}")

    def on_train_end(self, logs=None):
        if self.json_path:
            with open(self.json_path, "w") as f:
                json.dump({"device": self.device, "lms_build": lms_available(),
                           "records": self.records}, f, indent=1)
            self.print_fn(f"[stats] wrote {self.json_path}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lms", action="store_true", help="enable Large Model Support")
    p.add_argument("--lms-defrag", action="store_true", help="enable LMS defragmentation")
    p.add_argument("--device", default=None, help="device for the statistics (default GPU:0 or CPU:0)")
    p.add_argument("--json", default=None, help="write the records here")
    a = p.parse_args(argv)
    configure_lms(a.lms or a.lms_defrag, a.lms_defrag)
    s = a.image_size
    model = tf.keras.Sequential([
        tf.keras.layers.Input((s, s, 3)),
        tf.keras.layers.Conv2D(16, 3, activation="relu", padding="same"),
        tf.keras.layers.Conv2D(32, 3, strides=2, activation="relu", padding="same"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(10),
    ])
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = tf.random.uniform([a.batch_size, s, s, 3])
    y = tf.random.uniform([a.batch_size], maxval=10, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    cb = AllocatorStatsCallback(a.device, every_n_batches=max(1, a.steps // 2), json_path=a.json)
    model.fit(ds, epochs=a.epochs, steps_per_epoch=a.steps, callbacks=[cb], verbose=0)
    print(f"trained {a.epochs}x{a.steps} steps; {len(cb.records)} statistics records "
          f"({'LMS build' if lms_available() else 'stock TensorFlow'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
