#!/usr/bin/env python3
"""Train Keras applications models on synthetic images, with or without LMS.

TensorFlow Large Model Support (LMS) lets the GPU's BFC allocator move the
least recently used tensors to host memory when the GPU is full (and bring
them back), so batch sizes or image sizes that fail with "OOM when allocating
tensor" train instead.  It needs a TensorFlow built with the LMS patch
(`make build TF=v2.14.1`); on a stock TensorFlow the LMS switches are reported
as unavailable and ignored.

Examples (on a GPU machine):

    # ResNet-50 at 448x448 with a batch that does not fit the GPU without LMS
    python examples/tensorflow/ManyModel.py -m ResNet50 --image-size 448 --batch-size 400 --lms

    # with defragmentation, allocator statistics every 5 steps, host swap space capped at 64 GiB
    TF_GPU_HOST_MEM_LIMIT_IN_MB=65536 python examples/tensorflow/ManyModel.py -m DenseNet121 \\
        --batch-size 512 --lms --lms-defrag --stats 5

    # a TensorBoard profile of steps 3-5 (the memory profile shows the swapping)
    python examples/tensorflow/ManyModel.py -m ResNet50 --lms --profile /tmp/tfprof

    # tiny run on a CPU (stock tensorflow-cpu is fine)
    python examples/tensorflow/ManyModel.py -m ResNet50 --image-size 32 --batch-size 2 --steps 2 --epochs 1
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402

from lms_stats_callback import (AllocatorStatsCallback, configure_lms,  # noqa: E402
                                format_stats, lms_available, read_stats)

# name in tf.keras.applications -> (default image size, smallest image size)
MODELS = {
    "ResNet50": (224, 32), "ResNet101": (224, 32), "ResNet152": (224, 32),
    "ResNet50V2": (224, 32), "ResNet152V2": (224, 32),
    "VGG16": (224, 32), "VGG19": (224, 32),
    "DenseNet121": (224, 32), "DenseNet201": (224, 32),
    "MobileNet": (224, 32), "MobileNetV2": (224, 32), "MobileNetV3Large": (224, 32),
    "InceptionV3": (299, 75), "InceptionResNetV2": (299, 75), "Xception": (299, 71),
    "EfficientNetB0": (224, 32), "EfficientNetB4": (380, 32), "EfficientNetV2S": (384, 32),
    "NASNetMobile": (224, 32), "ConvNeXtTiny": (224, 32), "RegNetY032": (224, 32),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="ResNet50", choices=sorted(MODELS) + ["all"],
                   help="Keras applications model ('all' trains each in turn)")
    p.add_argument("--image-size", type=int, default=None, help="default: the model's usual size")
    p.add_argument("-b", "--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2, help="the first epoch is the warm-up")
    p.add_argument("--steps", type=int, default=10, help="steps per epoch")
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--mixed-precision", action="store_true", help="mixed_float16 policy")
    p.add_argument("--device", default=None, help="device for the statistics (default GPU:0 or CPU:0)")
    lms = p.add_argument_group("Large Model Support")
    lms.add_argument("--lms", action="store_true",
                     help="tf.config.experimental.set_lms_enabled(True)")
    lms.add_argument("--lms-defrag", action="store_true",
                     help="tf.config.experimental.set_lms_defrag_enabled(True) (implies --lms)")
    lms.add_argument("--host-limit-mb", type=int, default=None,
                     help="set TF_GPU_HOST_MEM_LIMIT_IN_MB (host swap space)")
    out = p.add_argument_group("statistics and profiling")
    out.add_argument("--stats", type=int, nargs="?", const=0, default=None, metavar="N",
                     help="print allocator/LMS statistics per epoch (and every N steps)")
    out.add_argument("--stats-json", default=None, help="write the statistics records here")
    out.add_argument("--profile", metavar="DIR", default=None,
                     help="TensorBoard profile (with memory profile) of steps 3-5 into DIR")
    return p.parse_args(argv)


def build_model(name: str, size: int, classes: int) -> tf.keras.Model:
    ctor = getattr(tf.keras.applications, name)
    return ctor(weights=None, input_shape=(size, size, 3), classes=classes)


def train(name: str, a) -> dict:
    size = a.image_size or MODELS[name][0]
    if size < MODELS[name][1]:
        raise SystemExit(f"{name} needs --image-size >= {MODELS[name][1]}")
    model = build_model(name, size, a.num_classes)
    opt = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    model.compile(opt, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=False))
    # Synthetic images and labels, made once and repeated.
    x = tf.random.uniform([a.batch_size, size, size, 3])
    y = tf.random.uniform([a.batch_size], maxval=a.num_classes, dtype=tf.int32)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat().prefetch(2)

    callbacks = []
    stats_cb = None
    if a.stats is not None or a.stats_json:
        stats_cb = AllocatorStatsCallback(a.device, every_n_batches=a.stats or 0,
                                          json_path=a.stats_json)
        callbacks.append(stats_cb)
    if a.profile:
        first = min(3, a.steps)
        callbacks.append(tf.keras.callbacks.TensorBoard(
            log_dir=os.path.join(a.profile, name), profile_batch=(first, min(first + 2, a.steps)),
            write_graph=False))

    class Timer(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            dt = time.perf_counter() - self.t
            self.times.append(dt)
            print(f"{name} {size}x{size} batch {a.batch_size}: epoch {epoch} "
                  f"{a.steps * a.batch_size / dt:.1f} img/s, loss {logs.get('loss', float('nan')):.4f}",
                  flush=True)

    timer = Timer()
    timer.times = []
    callbacks.append(timer)
    print(f"== {name}: image {size}x{size}, batch {a.batch_size}, {a.epochs}x{a.steps} steps, "
          f"{model.count_params() / 1e6:.1f}M parameters", flush=True)
    model.fit(ds, epochs=a.epochs, steps_per_epoch=a.steps, callbacks=callbacks, verbose=0)
    timed = timer.times[1:] or timer.times
    result = {"model": name, "image_size": size, "batch_size": a.batch_size,
              "img_per_s": a.steps * a.batch_size * len(timed) / sum(timed)}
    source, stats, _ = read_stats(stats_cb.device if stats_cb else
                                  (a.device or ("GPU:0" if tf.config.list_physical_devices("GPU")
                                                else "CPU:0")))
    if stats:
        print(f"[stats] final ({source}): {format_stats(stats)}", flush=True)
    return result


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.host_limit_mb is not None:
        os.environ["TF_GPU_HOST_MEM_LIMIT_IN_MB"] = str(a.host_limit_mb)
    lms_on = configure_lms(a.lms or a.lms_defrag, a.lms_defrag)
    if a.mixed_precision:
        tf.keras.mixed_precision.set_global_policy("mixed_float16")
    gpus = tf.config.list_physical_devices("GPU")
    print(f"TensorFlow {tf.__version__}, GPUs: {[g.name for g in gpus] or 'none'}, "
          f"LMS build: {lms_available()}, LMS on: {lms_on}", flush=True)
    names = sorted(MODELS) if a.model == "all" else [a.model]
    rc = 0
    for name in names:
        try:
            r = train(name, a)
            print(f"RESULT {name} {r['image_size']} {r['batch_size']} {r['img_per_s']:.1f} img/s",
                  flush=True)
        except tf.errors.ResourceExhaustedError as e:
            first = str(e).strip().splitlines()[0][:300]
            hint = "" if lms_on else (" Try --lms" + ("" if lms_available() else
                                      " on a TensorFlow built with LMS (make build TF=v2.14.1)") + ".")
            print(f"OOM {name}: {first}.{hint}", flush=True)
            rc = 2
    return rc


if __name__ == "__main__":
    sys.exit(main())
